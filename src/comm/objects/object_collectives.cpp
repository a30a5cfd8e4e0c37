// The object collectives: PyTorch's protocol (sizes first, then one byte
// buffer padded to the largest) over framed objects (Note [Object frames]).

#include <ddp/comm/object_collectives.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>

#include <ddp/group.h>
#include <ddp/init.h>

#include "comm/objects/object_frame.h"
#include "internal/check.h"

namespace ddp {
namespace {

// The group to use and where its buffers live.
struct Place {
  std::shared_ptr<ProcessGroup> group;
  std::string who; // "[rank R/W] all_gather_object"
  at::TensorOptions bytes;
  at::TensorOptions longs;
};

Place place_for(const std::shared_ptr<ProcessGroup>& given, const char* op) {
  Place place;
  place.group = given ? given : default_process_group();
  DDP_CHECK(place.group, op, ": no process group; call ddp::init_process_group() first or pass a group");
  place.who = c10::str("[rank ", place.group->rank(), "/", place.group->size(), "] ", op);
  DDP_CHECK(is_member(place.group), place.who, ": this process is not a member of the group");
  // NCCL moves device memory only: the buffers go through the current GPU.
  const at::Device device = place.group->needs_device_buffers() ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  place.bytes = at::TensorOptions().dtype(at::kByte).device(device);
  place.longs = at::TensorOptions().dtype(at::kLong).device(device);
  return place;
}

// The group rank of global rank `global`, checked.
int rank_in(const Place& place, int global, const char* role) {
  const auto ranks = group_ranks(place.group);
  const auto at = std::find(ranks.begin(), ranks.end(), global);
  DDP_CHECK(at != ranks.end(), place.who, ": ", role, " rank ", global,
            " is not a rank of the group (global ranks ", c10::Join(", ", ranks), ")");
  return static_cast<int>(at - ranks.begin());
}

at::Tensor to_tensor(const Place& place, const std::vector<int64_t>& values) {
  return at::tensor(values, at::kLong).to(place.longs.device());
}

std::vector<int64_t> to_values(const at::Tensor& t) {
  const auto host = t.cpu().contiguous();
  return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
}

// `frames` packed into one buffer of `each` bytes per frame (0: their own
// sizes, back to back).
at::Tensor pack(const Place& place, const std::vector<std::string>& frames, int64_t each) {
  int64_t total = 0;
  for (const auto& f : frames) {
    total += each > 0 ? each : static_cast<int64_t>(f.size());
  }
  auto host = at::zeros({total}, at::kByte);
  int64_t at = 0;
  for (const auto& f : frames) {
    std::memcpy(host.data_ptr<uint8_t>() + at, f.data(), f.size());
    at += each > 0 ? each : static_cast<int64_t>(f.size());
  }
  return host.to(place.bytes.device());
}

int64_t largest(const std::vector<int64_t>& sizes) {
  return sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
}

// ---- The four, on framed objects; `decode(data, size, who, from)` unframes one.

template <typename T>
using Decode = std::function<T(const uint8_t*, size_t, const std::string& who, const std::string& from)>;

// Decodes `objects` from `buffer`, which holds their frames back to back
// (`sizes` bytes each), all sent by global rank `src`.
template <typename T>
void unpack_frames(const at::Tensor& buffer, const std::vector<int64_t>& sizes, std::vector<T>& objects,
                   const Place& place, int src, const Decode<T>& decode) {
  const auto host = buffer.cpu();
  int64_t at = 0;
  for (size_t i = 0; i < objects.size(); ++i) {
    objects[i] = decode(host.data_ptr<uint8_t>() + at, static_cast<size_t>(sizes[i]), place.who,
                        c10::str("rank ", src, " (object ", i, ")"));
    at += sizes[i];
  }
}

template <typename T>
void broadcast_frames(std::vector<T>& objects, int src, const std::shared_ptr<ProcessGroup>& group,
                      const std::function<std::string(const T&)>& encode, const Decode<T>& decode) {
  const Place place = place_for(group, "broadcast_object_list");
  const int root = rank_in(place, src, "src");
  const bool mine = place.group->rank() == root;
  std::vector<std::string> frames;
  std::vector<int64_t> sizes(objects.size(), 0);
  if (mine) {
    for (size_t i = 0; i < objects.size(); ++i) {
      frames.push_back(encode(objects[i]));
      sizes[i] = static_cast<int64_t>(frames.back().size());
    }
  }
  // Sizes first (a list of another length on some rank fails the group's
  // fingerprint check, naming both), then the frames back to back.
  auto size_tensor = to_tensor(place, sizes);
  BroadcastOptions options;
  options.root_rank = root;
  place.group->broadcast(size_tensor, options)->wait();
  sizes = to_values(size_tensor);
  auto buffer = mine ? pack(place, frames, 0)
                     : at::empty({std::accumulate(sizes.begin(), sizes.end(), int64_t{0})}, place.bytes);
  place.group->broadcast(buffer, options)->wait();
  if (mine) {
    return;
  }
  unpack_frames(buffer, sizes, objects, place, src, decode);
}

template <typename T>
void all_gather_frames(std::vector<T>& objects, const T& object, const std::shared_ptr<ProcessGroup>& group,
                       const std::function<std::string(const T&)>& encode, const Decode<T>& decode) {
  const Place place = place_for(group, "all_gather_object");
  const int world = place.group->size();
  const std::string frame = encode(object);
  auto sizes_tensor = at::empty({world}, place.longs);
  place.group->allgather_into_tensor(sizes_tensor, to_tensor(place, {static_cast<int64_t>(frame.size())}))->wait();
  const auto sizes = to_values(sizes_tensor);
  const int64_t each = largest(sizes);
  auto all = at::empty({each * world}, place.bytes);
  place.group->allgather_into_tensor(all, pack(place, {frame}, each))->wait();
  const auto host = all.cpu();
  const auto ranks = group_ranks(place.group);
  objects.clear();
  for (int r = 0; r < world; ++r) {
    objects.push_back(decode(host.data_ptr<uint8_t>() + r * each, static_cast<size_t>(sizes[r]), place.who,
                             c10::str("rank ", ranks[r])));
  }
}

template <typename T>
void gather_frames(const T& object, std::vector<T>* gathered, int dst, const std::shared_ptr<ProcessGroup>& group,
                   const std::function<std::string(const T&)>& encode, const Decode<T>& decode) {
  const Place place = place_for(group, "gather_object");
  const int root = rank_in(place, dst, "dst");
  const int world = place.group->size();
  const bool mine = place.group->rank() == root;
  DDP_CHECK(!mine || gathered != nullptr, place.who, ": this rank is dst (", dst,
            ") and needs a list to gather into; got nullptr");
  const std::string frame = encode(object);
  auto sizes_tensor = at::empty({world}, place.longs);
  place.group->allgather_into_tensor(sizes_tensor, to_tensor(place, {static_cast<int64_t>(frame.size())}))->wait();
  const auto sizes = to_values(sizes_tensor);
  const int64_t each = largest(sizes);
  std::vector<at::Tensor> outputs;
  if (mine) {
    for (int r = 0; r < world; ++r) {
      outputs.push_back(at::empty({each}, place.bytes));
    }
  }
  GatherOptions options;
  options.root_rank = root;
  place.group->gather(outputs, pack(place, {frame}, each), options)->wait();
  if (!mine) {
    return;
  }
  const auto ranks = group_ranks(place.group);
  gathered->clear();
  for (int r = 0; r < world; ++r) {
    const auto host = outputs[r].cpu();
    gathered->push_back(decode(host.data_ptr<uint8_t>(), static_cast<size_t>(sizes[r]), place.who,
                                c10::str("rank ", ranks[r])));
  }
}

template <typename T>
void scatter_frames(std::vector<T>& output, const std::vector<T>& inputs, int src,
                    const std::shared_ptr<ProcessGroup>& group, const std::function<std::string(const T&)>& encode,
                    const Decode<T>& decode) {
  const Place place = place_for(group, "scatter_object_list");
  const int root = rank_in(place, src, "src");
  const int world = place.group->size();
  const bool mine = place.group->rank() == root;
  DDP_CHECK(!output.empty(), place.who, ": the output list is empty; expected at least one element (element 0 "
            "receives this rank's object)");
  std::vector<std::string> frames;
  std::vector<int64_t> sizes(static_cast<size_t>(world), 0);
  if (mine) {
    DDP_CHECK(inputs.size() == static_cast<size_t>(world), place.who, ": src has ", inputs.size(),
              " objects to scatter, expected ", world, " (one per rank)");
    for (int r = 0; r < world; ++r) {
      frames.push_back(encode(inputs[r]));
      sizes[r] = static_cast<int64_t>(frames.back().size());
    }
  }
  // Every rank's size (a broadcast of the table), then the padded frames.
  auto sizes_tensor = to_tensor(place, sizes);
  BroadcastOptions broadcast;
  broadcast.root_rank = root;
  place.group->broadcast(sizes_tensor, broadcast)->wait();
  sizes = to_values(sizes_tensor);
  const int64_t each = largest(sizes);
  std::vector<at::Tensor> chunks;
  if (mine) {
    const auto packed = pack(place, frames, each);
    for (int r = 0; r < world; ++r) {
      chunks.push_back(packed.narrow(0, r * each, each));
    }
  }
  auto received = at::empty({each}, place.bytes);
  ScatterOptions options;
  options.root_rank = root;
  place.group->scatter(received, chunks, options)->wait();
  const auto host = received.cpu();
  output[0] = decode(host.data_ptr<uint8_t>(), static_cast<size_t>(sizes[place.group->rank()]),
                     place.who, c10::str("rank ", src));
}

// send_object_list / recv_object_list: PyTorch sends the sizes, then the
// objects back to back; ddp sends their count first, so that a receiver
// whose list has another length takes every message of the sender anyway
// (the pair stays in step) and then fails, saying both lengths.
template <typename T>
void send_frames(const std::vector<T>& objects, int dst, const std::shared_ptr<ProcessGroup>& group,
                 const std::function<std::string(const T&)>& encode) {
  const Place place = place_for(group, "send_object_list");
  const int peer = rank_in(place, dst, "dst");
  DDP_CHECK(peer != place.group->rank(), place.who, ": dst ", dst,
            " is this rank itself; expected another rank to send to");
  std::vector<std::string> frames;
  std::vector<int64_t> sizes;
  for (const auto& object : objects) {
    frames.push_back(encode(object));
    sizes.push_back(static_cast<int64_t>(frames.back().size()));
  }
  place.group->send(to_tensor(place, {static_cast<int64_t>(objects.size())}), peer)->wait();
  if (!objects.empty()) {
    place.group->send(to_tensor(place, sizes), peer)->wait();
    place.group->send(pack(place, frames, 0), peer)->wait();
  }
}

template <typename T>
int recv_frames(std::vector<T>& objects, int src, const std::shared_ptr<ProcessGroup>& group,
                const Decode<T>& decode) {
  const Place place = place_for(group, "recv_object_list");
  const int peer = rank_in(place, src, "src");
  DDP_CHECK(peer != place.group->rank(), place.who, ": src ", src,
            " is this rank itself; expected another rank to receive from");
  auto count_tensor = at::empty({1}, place.longs);
  place.group->recv(count_tensor, peer)->wait();
  const int64_t count = to_values(count_tensor)[0];
  DDP_CHECK(count >= 0 && count <= (int64_t{1} << 32), place.who, ": rank ", src,
            " announced ", count, " objects; expected ", objects.size());
  std::vector<int64_t> sizes;
  at::Tensor buffer;
  if (count > 0) {
    auto sizes_tensor = at::empty({count}, place.longs);
    place.group->recv(sizes_tensor, peer)->wait();
    sizes = to_values(sizes_tensor);
    int64_t total = 0;
    for (const int64_t size : sizes) {
      DDP_CHECK(size >= 0, place.who, ": rank ", src, " announced an object of ", size, " bytes");
      total += size;
    }
    buffer = at::empty({total}, place.bytes);
    place.group->recv(buffer, peer)->wait();
  }
  DDP_CHECK(count == static_cast<int64_t>(objects.size()), place.who, ": rank ", src, " sent ", count,
            " objects, but object_list has ", objects.size(),
            " elements; expected them equal (the receiver's list must have the sender's length)");
  if (count == 0) {
    return src;
  }
  unpack_frames(buffer, sizes, objects, place, src, decode);
  return src;
}

std::string encode_value(const c10::IValue& value) {
  return internal::encode_ivalue(value);
}

const Decode<c10::IValue> kDecodeValue = [](const uint8_t* data, size_t size, const std::string& who,
                                             const std::string& from) {
  return internal::decode_ivalue(data, size, who, from);
};

std::string encode_bytes(const std::string& bytes) {
  return internal::frame_object(internal::ObjectKind::kBytes, bytes.data(), bytes.size());
}

const Decode<std::string> kDecodeBytes = [](const uint8_t* data, size_t size, const std::string& who,
                                             const std::string& from) {
  return internal::unframe_object(data, size, internal::ObjectKind::kBytes, who, from);
};

} // namespace

void broadcast_object_list(std::vector<c10::IValue>& objects, int src, const std::shared_ptr<ProcessGroup>& group) {
  broadcast_frames<c10::IValue>(objects, src, group, encode_value, kDecodeValue);
}

void all_gather_object(std::vector<c10::IValue>& objects, const c10::IValue& object,
                       const std::shared_ptr<ProcessGroup>& group) {
  all_gather_frames<c10::IValue>(objects, object, group, encode_value, kDecodeValue);
}

void gather_object(const c10::IValue& object, std::vector<c10::IValue>* gathered, int dst,
                   const std::shared_ptr<ProcessGroup>& group) {
  gather_frames<c10::IValue>(object, gathered, dst, group, encode_value, kDecodeValue);
}

void scatter_object_list(std::vector<c10::IValue>& output, const std::vector<c10::IValue>& inputs, int src,
                         const std::shared_ptr<ProcessGroup>& group) {
  scatter_frames<c10::IValue>(output, inputs, src, group, encode_value, kDecodeValue);
}

void broadcast_bytes_list(std::vector<std::string>& objects, int src, const std::shared_ptr<ProcessGroup>& group) {
  broadcast_frames<std::string>(objects, src, group, encode_bytes, kDecodeBytes);
}

void all_gather_bytes(std::vector<std::string>& objects, const std::string& object,
                      const std::shared_ptr<ProcessGroup>& group) {
  all_gather_frames<std::string>(objects, object, group, encode_bytes, kDecodeBytes);
}

void gather_bytes(const std::string& object, std::vector<std::string>* gathered, int dst,
                  const std::shared_ptr<ProcessGroup>& group) {
  gather_frames<std::string>(object, gathered, dst, group, encode_bytes, kDecodeBytes);
}

void scatter_bytes_list(std::vector<std::string>& output, const std::vector<std::string>& inputs, int src,
                        const std::shared_ptr<ProcessGroup>& group) {
  scatter_frames<std::string>(output, inputs, src, group, encode_bytes, kDecodeBytes);
}

void send_object_list(const std::vector<c10::IValue>& objects, int dst, const std::shared_ptr<ProcessGroup>& group) {
  send_frames<c10::IValue>(objects, dst, group, encode_value);
}

int recv_object_list(std::vector<c10::IValue>& objects, int src, const std::shared_ptr<ProcessGroup>& group) {
  return recv_frames<c10::IValue>(objects, src, group, kDecodeValue);
}

void send_bytes_list(const std::vector<std::string>& objects, int dst, const std::shared_ptr<ProcessGroup>& group) {
  send_frames<std::string>(objects, dst, group, encode_bytes);
}

int recv_bytes_list(std::vector<std::string>& objects, int src, const std::shared_ptr<ProcessGroup>& group) {
  return recv_frames<std::string>(objects, src, group, kDecodeBytes);
}

} // namespace ddp
