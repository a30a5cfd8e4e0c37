#pragma once

// Minimal logging to stderr (private header). Warnings go to stderr whole
// lines at a time so that ddprun's per-rank prefixes stay readable.

#include <string>

namespace ddp::internal {

void log_warning(const std::string& message);
void log_info(const std::string& message);

} // namespace ddp::internal
