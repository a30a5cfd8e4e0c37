#pragma once

// The two halves of DCP (private header): dcp_save.cpp writes a rank's
// items and rank 0 the metadata; dcp_load.cpp checks and reads. `group` is
// nullptr for a process alone.

#include <functional>
#include <memory>
#include <string>

#include <ddp/checkpoint/state_dict.h>
#include <ddp/comm/process_group.h>

#include "checkpoint/dcp/items.h"

namespace ddp::checkpoint::dcp {

void save_items_to(const std::shared_ptr<ProcessGroup>& group, const SaveItems& items, const std::string& dir);

IncompatibleKeys load_items_from(const std::shared_ptr<ProcessGroup>& group, const std::string& dir, bool strict,
                                 const std::function<LoadItems(const Metadata&)>& build);

// Every rank's result of `body`, once every rank succeeded (a collective;
// local when `group` is nullptr). When any rank failed, every rank throws
// c10::Error starting with `prefix`, naming the first that did.
std::vector<std::string> exchange(const std::shared_ptr<ProcessGroup>& group, const std::string& prefix,
                                  const std::function<std::string()>& body);

// A chunk of a saved tensor, read from its file: checked against the
// metadata's dtype and box.
at::Tensor read_chunk(const std::string& dir, const Metadata& metadata, const std::string& key, size_t chunk);

// A bytes entry of the checkpoint, read from its file.
pickle::ValuePtr read_bytes(const std::string& dir, const Metadata& metadata, const std::string& key);

} // namespace ddp::checkpoint::dcp
