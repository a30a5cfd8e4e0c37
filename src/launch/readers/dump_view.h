#pragma once

// What `ddprun --analyze` keeps of the ranks' dumps, whichever format they
// came in: ddp's (Note [Flight recorder]) or PyTorch's flight recorder in its
// JSON form (pytorch_dump.cpp). Plain C++17, no Torch.

#include <cstdint>
#include <map>
#include <string>

#include "internal/json.h"

namespace ddp::flight_recorder {

// One collective as one rank recorded it.
struct Record {
  std::string op;
  std::string shape;
  std::string state; // queued, started, completed or failed
  std::string error;
  int64_t queued_us = 0;
  int64_t started_us = 0;
};

// One rank's view of one group.
struct RankView {
  int64_t dumped_at_us = 0; // 0: unknown (PyTorch's dumps carry no time)
  std::string reason;
  int world_rank = -1;
  std::map<int64_t, Record> by_seq;
};

struct GroupView {
  std::string backend;
  int size = 0;
  std::map<int, RankView> ranks; // by group rank
};

// Reads a dump of PyTorch's flight recorder in its JSON form (the output of
// torch's _dump_fr_trace_json / _dump_nccl_trace_json, version 2.x) written
// by global rank `rank` (PyTorch's dumps do not name it: the file name does)
// into `groups`. Point-to-point entries are left out. Throws
// std::runtime_error saying what is wrong.
void read_pytorch_dump(const json::Value& dump, int rank, std::map<std::string, GroupView>& groups);

// Whether `dump` looks like one of PyTorch's JSON dumps.
bool is_pytorch_dump(const json::Value& dump);

} // namespace ddp::flight_recorder
