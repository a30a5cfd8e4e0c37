// Saving a DCP directory (engine.h).
//
// How it works, in three exchanges (every rank learns whether every rank
// succeeded at each, so that a failure anywhere fails every rank, naming
// it, instead of leaving the others waiting):
//   1. plans: each rank describes what it holds (key, dtype, size, box;
//      bytes items by key); rank 0 first creates the directory and picks
//      the generation n of this save's files, one more than any
//      `__<r>_<n>.distcp` there, so that no file of the committed
//      checkpoint is overwritten. Every rank then merges the plans alike:
//      the checkpoint's entries, and for each piece (key and offsets) held
//      by several ranks the one that writes it, the least loaded so far.
//   2. files: each rank writes its pieces to `__<rank>_<n>.distcp`, each a
//      torch.save archive of one tensor (or of one object) at its offset,
//      and fsyncs it; the exchange carries every piece's place.
//   3. commit: rank 0 writes `.metadata` under a temporary name, fsyncs it
//      and renames it into place (Note [DCP commit]), then removes the
//      files the new metadata does not name: the previous save's, and
//      those of a save killed before its commit.
//
// Note [DCP commit]: readers find a checkpoint's files through its
// `.metadata` alone, and a save writes only files of a new generation, so
// until the rename the old `.metadata` and every file it names are intact;
// after it, the new ones are complete and on disk.

#include <torch/torch.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include <ddp/comm/error.h>
#include <ddp/comm/object_collectives.h>

#include "checkpoint/agree.h"
#include "checkpoint/dcp/boxes.h"
#include "checkpoint/dcp/engine.h"
#include "checkpoint/dcp/wire.h"
#include "checkpoint/torch_save.h"
#include "comm/collective_label.h"
#include "internal/check.h"
#include "nn/checkpoint_files.h"

namespace ddp::checkpoint::dcp {

namespace {

// Estimated size of a bytes item (an option) for the writers' balance.
constexpr int64_t kBytesItemCost = 1300;

void make_directories(const std::string& dir) {
  std::string partial;
  size_t from = 0;
  while (from <= dir.size()) {
    const size_t slash = dir.find('/', from);
    partial = dir.substr(0, slash == std::string::npos ? dir.size() : slash);
    if (!partial.empty() && ::mkdir(partial.c_str(), 0777) != 0 && errno != EEXIST) {
      throw std::runtime_error(c10::str("cannot create directory '", partial, "': ", internal::errno_text(errno)));
    }
    if (slash == std::string::npos) {
      break;
    }
    from = slash + 1;
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw std::runtime_error("'" + dir + "' is not a directory");
  }
}

// The files of `dir` named `__<rank>_<n>.distcp`, with n.
std::vector<std::pair<std::string, int64_t>> chunk_files(const std::string& dir) {
  std::vector<std::pair<std::string, int64_t>> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    return out;
  }
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    const std::string suffix = ".distcp";
    if (name.size() < 2 + suffix.size() || name.compare(0, 2, "__") != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const std::string middle = name.substr(2, name.size() - 2 - suffix.size());
    const size_t underscore = middle.find('_');
    if (underscore == std::string::npos || !internal::all_of_chars(middle.substr(0, underscore), 0, "0123456789") ||
        !internal::all_of_chars(middle, underscore + 1, "0123456789")) {
      continue;
    }
    out.emplace_back(name, std::stoll(middle.substr(underscore + 1)));
  }
  ::closedir(d);
  return out;
}

struct Piece {
  int rank;
  size_t local; // index into that rank's tensors or bytes
  bool tensor;
  std::string key;
  std::vector<PathStep> path;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> size;
  Box box;
};

std::string encode_plan(const SaveItems& items, int64_t generation, const std::string& save_id) {
  wire::Out out;
  out.i64(generation);
  out.str(save_id);
  auto path = [&](const std::vector<PathStep>& steps) {
    out.i64(static_cast<int64_t>(steps.size()));
    for (const auto& s : steps) {
      if (std::holds_alternative<int64_t>(s)) {
        out.i64(0);
        out.i64(std::get<int64_t>(s));
      } else {
        out.i64(1);
        out.str(std::get<std::string>(s));
      }
    }
  };
  out.i64(static_cast<int64_t>(items.tensors.size()));
  for (const auto& t : items.tensors) {
    out.str(t.key);
    path(t.path);
    out.i64(static_cast<int64_t>(t.dtype));
    out.dims(t.size);
    out.dims(t.box.offsets);
    out.dims(t.box.sizes);
  }
  out.i64(static_cast<int64_t>(items.bytes.size()));
  for (const auto& b : items.bytes) {
    out.str(b.key);
    path(b.path);
  }
  return out.take();
}

std::vector<Piece> decode_plan(const std::string& bytes, int rank, int64_t* generation, std::string* save_id) {
  wire::In in(bytes);
  *generation = in.i64();
  *save_id = in.str();
  auto path = [&] {
    std::vector<PathStep> steps(static_cast<size_t>(std::max<int64_t>(in.i64(), 0)));
    for (auto& s : steps) {
      if (in.i64() == 0) {
        s = in.i64();
      } else {
        s = in.str();
      }
    }
    return steps;
  };
  std::vector<Piece> pieces;
  const int64_t tensors = in.i64();
  for (int64_t i = 0; i < tensors; ++i) {
    Piece p;
    p.rank = rank;
    p.local = static_cast<size_t>(i);
    p.tensor = true;
    p.key = in.str();
    p.path = path();
    p.dtype = static_cast<at::ScalarType>(in.i64());
    p.size = in.dims();
    p.box.offsets = in.dims();
    p.box.sizes = in.dims();
    pieces.push_back(std::move(p));
  }
  const int64_t bytes_items = in.i64();
  for (int64_t i = 0; i < bytes_items; ++i) {
    Piece p;
    p.rank = rank;
    p.local = static_cast<size_t>(i);
    p.tensor = false;
    p.key = in.str();
    p.path = path();
    pieces.push_back(std::move(p));
  }
  if (!in.done()) {
    throw std::runtime_error("a DCP plan from another rank is longer than it says");
  }
  return pieces;
}

struct Merged {
  Metadata metadata;
  // Per rank, the local pieces it writes: (tensor?, local index, chunk key).
  std::vector<std::vector<std::tuple<bool, size_t, ChunkKey>>> writes;
};

std::string describe(const Piece& p) {
  return c10::str(p.tensor ? c10::str(p.dtype, c10::IntArrayRef(p.size)) : std::string("an object"));
}

// Every rank's plan merged, the same on every rank. Throws when ranks
// disagree on a key or hold pieces that overlap without being equal.
Merged merge(const std::vector<std::vector<Piece>>& plans, const std::string& prefix) {
  Merged m;
  m.writes.resize(plans.size());
  std::map<std::string, size_t> entry_of;
  std::map<std::string, const Piece*> first_of;
  std::map<ChunkKey, std::vector<const Piece*>> holders;
  std::vector<ChunkKey> order;
  for (const auto& plan : plans) {
    for (const auto& p : plan) {
      auto found = entry_of.find(p.key);
      if (found == entry_of.end()) {
        entry_of[p.key] = m.metadata.entries.size();
        first_of[p.key] = &p;
        m.metadata.planner_data.emplace_back(p.key, p.path);
        if (p.tensor) {
          TensorEntry t;
          t.dtype = p.dtype;
          t.size = p.size;
          m.metadata.entries.emplace_back(p.key, t);
        } else {
          m.metadata.entries.emplace_back(p.key, BytesEntry{});
        }
        found = entry_of.find(p.key);
      }
      const Piece& first = *first_of[p.key];
      DDP_CHECK(first.tensor == p.tensor && (!p.tensor || (first.dtype == p.dtype && first.size == p.size)), prefix,
                ": ranks disagree on '", p.key, "': rank ", first.rank, " holds ", describe(first), ", rank ", p.rank,
                " ", describe(p), " (are the models the same on every rank?)");
      ChunkKey chunk{p.key, p.tensor, p.box.offsets};
      auto& who_holds = holders[chunk];
      if (who_holds.empty()) {
        order.push_back(chunk);
        if (p.tensor) {
          auto& entry = std::get<TensorEntry>(m.metadata.entries[found->second].second);
          for (const auto& box : entry.chunks) {
            const auto overlap = intersect(box, p.box);
            DDP_CHECK(!overlap.has_value(), prefix, ": rank ", p.rank, " holds a piece of '", p.key, "' at ",
                      c10::IntArrayRef(p.box.offsets), " that overlaps another rank's at ",
                      c10::IntArrayRef(box.offsets));
          }
          entry.chunks.push_back(p.box);
        }
      } else {
        DDP_CHECK(!p.tensor || who_holds.front()->box.sizes == p.box.sizes, prefix, ": ranks ",
                  who_holds.front()->rank, " and ", p.rank, " hold pieces of '", p.key, "' at ",
                  c10::IntArrayRef(p.box.offsets), " of different sizes");
      }
      who_holds.push_back(&p);
    }
  }
  // Writers: each piece to the rank among its holders with the fewest
  // bytes so far (the lowest on a tie), pieces in order of first sight.
  std::vector<int64_t> load(plans.size(), 0);
  for (const auto& chunk : order) {
    const Piece* best = nullptr;
    for (const Piece* p : holders[chunk]) {
      if (best == nullptr || load[p->rank] < load[best->rank] ||
          (load[p->rank] == load[best->rank] && p->rank < best->rank)) {
        best = p;
      }
    }
    const int64_t cost =
        best->tensor ? best->box.numel() * static_cast<int64_t>(c10::elementSize(best->dtype)) : kBytesItemCost;
    load[best->rank] += cost;
    m.writes[best->rank].emplace_back(best->tensor, best->local, chunk);
  }
  return m;
}

// Writes `items`'s pieces named by `writes` to dir/name; returns each
// piece's place, encoded.
std::string write_rank_file(const SaveItems& items, const std::vector<std::tuple<bool, size_t, ChunkKey>>& writes,
                            const std::string& dir, const std::string& name) {
  wire::Out out;
  out.i64(static_cast<int64_t>(writes.size()));
  if (writes.empty()) {
    return out.take();
  }
  internal::NewFile file(dir + "/" + name, internal::NewFile::Checksummed::kNo);
  int64_t written = 0;
  ArchiveWriter writer = [&](const void* data, size_t size) {
    const size_t n = file.write(data, size);
    written += static_cast<int64_t>(n);
    return n;
  };
  for (const auto& [tensor, local, chunk] : writes) {
    const int64_t offset = written;
    try {
      if (tensor) {
        write_torch_archive(*pickle::tensor(items.tensors[local].data), writer);
      } else {
        write_torch_archive(*items.bytes[local].value, writer);
      }
    } catch (const c10::Error&) {
      throw std::runtime_error(c10::str("cannot write '", dir, "/", name, "' (is the disk full?)"));
    }
    out.str(chunk.key);
    out.i64(chunk.tensor ? 1 : 0);
    out.dims(chunk.offsets);
    out.i64(offset);
    out.i64(written - offset);
  }
  internal::crash_point("dcp-rank-file-partial", &file);
  file.finish();
  return out.take();
}

} // namespace

void save_items_to(const std::shared_ptr<ProcessGroup>& group, const SaveItems& items, const std::string& dir) {
  const int rank = group ? group->rank() : 0;
  const std::string prefix = group ? who(*group, "dcp::save") : std::string("dcp::save");
  DDP_CHECK(!dir.empty(), prefix, ": the checkpoint's path is empty");

  // 1. Plans.
  const auto plans = exchange(group, prefix, [&] {
    int64_t generation = 0;
    std::string save_id;
    if (rank == 0) {
      make_directories(dir);
      for (const auto& [name, n] : chunk_files(dir)) {
        generation = std::max(generation, n + 1);
      }
      save_id = internal::new_save_id();
    }
    return encode_plan(items, generation, save_id);
  });
  std::vector<std::vector<Piece>> pieces;
  int64_t generation = 0;
  std::string save_id;
  for (size_t r = 0; r < plans.size(); ++r) {
    int64_t g = 0;
    std::string id;
    pieces.push_back(decode_plan(plans[r], static_cast<int>(r), &g, &id));
    if (r == 0) {
      generation = g;
      save_id = id;
    }
  }
  Merged merged = merge(pieces, prefix);

  // 2. Files.
  const std::string file_name = c10::str("__", rank, "_", generation, ".distcp");
  const auto places = exchange(group, prefix, [&] {
    auto encoded = write_rank_file(items, merged.writes[rank], dir, file_name);
    internal::crash_point("dcp-rank-file-written");
    return encoded;
  });

  // 3. Commit.
  exchange(group, prefix, [&] {
    if (rank != 0) {
      return std::string();
    }
    Metadata& md = merged.metadata;
    for (size_t r = 0; r < places.size(); ++r) {
      wire::In in(places[r]);
      const int64_t n = in.i64();
      for (int64_t i = 0; i < n; ++i) {
        ChunkKey chunk;
        chunk.key = in.str();
        chunk.tensor = in.i64() != 0;
        chunk.offsets = in.dims();
        StorageInfo info;
        info.relative_path = c10::str("__", r, "_", generation, ".distcp");
        info.offset = in.i64();
        info.length = in.i64();
        md.storage[chunk] = info;
      }
    }
    md.save_id = save_id;
    md.checkpoint_id = dir;
    const std::string bytes = pickle::Writer().write(*metadata_value(md));
    const std::string path = dir + "/.metadata";
    const std::string tmp = c10::str(path, ".tmp.", ::getpid());
    try {
      internal::NewFile file(tmp);
      if (file.write(bytes.data(), bytes.size()) != bytes.size()) {
        throw std::runtime_error(c10::str("cannot write '", tmp, "' (is the disk full?)"));
      }
      internal::crash_point("dcp-metadata-partial", &file);
      file.finish();
      internal::crash_point("dcp-metadata-written");
      internal::rename_file(tmp, path); // the commit: Note [DCP commit]
    } catch (...) {
      std::remove(tmp.c_str());
      throw;
    }
    internal::sync_directory(dir);
    internal::crash_point("dcp-committed");
    // The files no committed checkpoint names any more.
    std::set<std::string> named;
    for (const auto& [chunk, info] : md.storage) {
      named.insert(info.relative_path);
    }
    for (const auto& [name, n] : chunk_files(dir)) {
      if (named.count(name) == 0) {
        std::remove((dir + "/" + name).c_str());
      }
    }
    DIR* d = ::opendir(dir.c_str());
    if (d != nullptr) {
      while (const dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        const std::string stale = ".metadata.tmp.";
        if (name.compare(0, stale.size(), stale) == 0) {
          std::remove((dir + "/" + name).c_str());
        }
      }
      ::closedir(d);
    }
    return std::string();
  });
}

std::vector<std::string> exchange(const std::shared_ptr<ProcessGroup>& group, const std::string& prefix,
                                  const std::function<std::string()>& body) {
  std::string result;
  std::string error;
  try {
    result = body();
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    error = error_message(e);
  }
  if (!group) {
    DDP_CHECK(error.empty(), prefix, ": ", error);
    return {result};
  }
  std::vector<std::string> all;
  {
    // "dcp::save", the prefix without its "[rank R/W] ".
    internal::CollectiveLabel label(prefix.substr(prefix.find("] ") == std::string::npos ? 0 : prefix.find("] ") + 2));
    all_gather_bytes(all, error.empty() ? "+" + result : "!" + error, group);
  }
  for (size_t r = 0; r < all.size(); ++r) {
    DDP_CHECK(!all[r].empty() && all[r][0] == '+', prefix, ": ",
              static_cast<int>(r) == group->rank() ? std::string("this rank") : c10::str("rank ", r), " failed: ",
              all[r].empty() ? std::string("(nothing came)") : all[r].substr(1));
  }
  for (auto& s : all) {
    s.erase(0, 1);
  }
  return all;
}

} // namespace ddp::checkpoint::dcp
