// The object collectives and batch_isend_irecv, run as real processes under
// ddprun (Gloo) and mpirun (MPI): IValues with tensors, strings and nested
// lists on every rank, 0-byte and 64 MiB objects, raw bytes, damaged
// frames, ring exchanges posted in any order, and the errors.

#include <torch/torch.h>

#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <ddp/ddp.h>

#include "comm/objects/object_frame.h"
#include "nn/rank_checks.h"

namespace {

using ddp_test::expect_error;
using ddp_test::list_of;
using ddp_test::Report;

// Rank r's object: a dict of every kind of value an IValue carries.
c10::IValue object_of(int rank) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("rank", static_cast<int64_t>(rank));
  dict.insert("name", "rank " + std::to_string(rank));
  dict.insert("weights", torch::arange(5, torch::kFloat) * rank);
  dict.insert("scale", 0.5 + rank);
  c10::impl::GenericList nested(c10::AnyType::get());
  nested.push_back(c10::List<int64_t>({rank, rank + 1}));
  nested.push_back(std::string(static_cast<size_t>(rank), 'x'));
  nested.push_back(c10::IValue());
  dict.insert("nested", nested);
  return dict;
}

// Whether `value` is object_of(rank), field by field; `why` says what not.
bool is_object_of(const c10::IValue& value, int rank, std::string& why) {
  if (!value.isGenericDict()) {
    why = "not a dict: " + value.tagKind();
    return false;
  }
  const auto dict = value.toGenericDict();
  const auto nested = dict.at("nested").toList();
  const bool ok = dict.size() == 5 && dict.at("rank").toInt() == rank &&
                  dict.at("name").toStringRef() == "rank " + std::to_string(rank) &&
                  torch::equal(dict.at("weights").toTensor(), torch::arange(5, torch::kFloat) * rank) &&
                  dict.at("scale").toDouble() == 0.5 + rank && nested.size() == 3 &&
                  nested.get(0).toIntVector() == std::vector<int64_t>{rank, rank + 1} &&
                  nested.get(1).toStringRef() == std::string(static_cast<size_t>(rank), 'x') &&
                  nested.get(2).isNone();
  if (!ok) {
    why = "differs from rank " + std::to_string(rank) + "'s object";
  }
  return ok;
}

std::string bytes_of(int rank) {
  std::string bytes = "bytes of rank " + std::to_string(rank);
  bytes.push_back('\0');
  bytes += std::string(static_cast<size_t>(rank) * 3, '\xff');
  return bytes;
}

void ivalues(Report& report, int rank, int world) {
  report.begin_case("all_gather_object of dicts with tensors, strings and nested lists");
  std::vector<c10::IValue> all;
  ddp::all_gather_object(all, object_of(rank));
  report.expect(all.size() == static_cast<size_t>(world), "got " + std::to_string(all.size()) + " objects");
  for (int r = 0; r < world && r < static_cast<int>(all.size()); ++r) {
    std::string why;
    report.expect(is_object_of(all[r], r, why), "object " + std::to_string(r) + ": " + why);
  }
  report.end_case();

  report.begin_case("broadcast_object_list from every rank, None and empty strings included");
  for (int src = 0; src < world; ++src) {
    std::vector<c10::IValue> list = {c10::IValue(), std::string(), c10::IValue(int64_t{-1})};
    if (rank == src) {
      list = {object_of(src), std::string(), c10::IValue()};
    }
    ddp::broadcast_object_list(list, src);
    std::string why;
    report.expect(is_object_of(list[0], src, why), "from " + std::to_string(src) + ": " + why);
    report.expect(list[1].isString() && list[1].toStringRef().empty(), "element 1 is not the empty string");
    report.expect(list[2].isNone(), "element 2 is not None");
  }
  report.end_case();

  report.begin_case("gather_object to the last rank, scatter_object_list from rank 0");
  std::vector<c10::IValue> gathered;
  ddp::gather_object(object_of(rank), rank == world - 1 ? &gathered : nullptr, world - 1);
  report.expect(rank == world - 1 ? gathered.size() == static_cast<size_t>(world) : gathered.empty(),
                "gathered " + std::to_string(gathered.size()) + " objects");
  for (size_t r = 0; r < gathered.size(); ++r) {
    std::string why;
    report.expect(is_object_of(gathered[r], static_cast<int>(r), why), "gathered " + std::to_string(r) + ": " + why);
  }
  std::vector<c10::IValue> inputs;
  if (rank == 0) {
    for (int r = 0; r < world; ++r) {
      inputs.push_back(object_of(r));
    }
  }
  std::vector<c10::IValue> output(1);
  ddp::scatter_object_list(output, inputs, 0);
  std::string why;
  report.expect(is_object_of(output[0], rank, why), "scattered: " + why);
  report.end_case();

  report.begin_case("a 64 MiB tensor broadcast, a 0-byte string gathered");
  std::vector<c10::IValue> big = {c10::IValue()};
  const int64_t count = (int64_t{64} << 20) / 4;
  if (rank == 0) {
    big[0] = torch::arange(count, torch::kInt);
  }
  ddp::broadcast_object_list(big, 0);
  report.expect(big[0].isTensor() && torch::equal(big[0].toTensor(), torch::arange(count, torch::kInt)),
                "the 64 MiB tensor differs");
  std::vector<std::string> empties;
  ddp::all_gather_bytes(empties, std::string());
  report.expect(empties == std::vector<std::string>(static_cast<size_t>(world)), "0-byte objects differ");
  report.note("64 MiB on every rank");
  report.end_case();
}

void raw_bytes(Report& report, int rank, int world) {
  report.begin_case("raw bytes: all four forms, with NUL and 0xff bytes");
  std::vector<std::string> all;
  ddp::all_gather_bytes(all, bytes_of(rank));
  std::vector<std::string> expected;
  for (int r = 0; r < world; ++r) {
    expected.push_back(bytes_of(r));
  }
  report.expect(all == expected, "all_gather_bytes differs");
  std::vector<std::string> list(2);
  if (rank == world - 1) {
    list = {bytes_of(world - 1), std::string()};
  }
  ddp::broadcast_bytes_list(list, world - 1);
  report.expect(list == std::vector<std::string>{bytes_of(world - 1), std::string()}, "broadcast_bytes_list differs");
  std::vector<std::string> gathered;
  ddp::gather_bytes(bytes_of(rank), rank == 0 ? &gathered : nullptr, 0);
  report.expect(rank != 0 || gathered == expected, "gather_bytes differs");
  std::vector<std::string> mine(1);
  ddp::scatter_bytes_list(mine, rank == 0 ? expected : std::vector<std::string>{}, 0);
  report.expect(mine[0] == bytes_of(rank), "scatter_bytes_list differs");
  report.end_case();
}

void damaged_frames(Report& report) {
  report.begin_case("damaged objects are clear errors naming the sender");
  using ddp::internal::decode_ivalue;
  const std::string who = "[rank 0/2] all_gather_object";
  const std::string frame = ddp::internal::encode_ivalue(object_of(1));
  const auto decode = [&](const std::string& bytes) {
    decode_ivalue(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), who, "rank 1");
  };
  std::string why;
  report.expect(is_object_of(ddp::internal::decode_ivalue(reinterpret_cast<const uint8_t*>(frame.data()),
                                                          frame.size(), who, "rank 1"),
                             1, why),
                "an intact frame: " + why);
  expect_error(report, [&] { decode(frame.substr(0, frame.size() - 7)); },
               "all_gather_object: the object from rank 1 is damaged: " + std::to_string(frame.size() - 39) +
                   " payload bytes arrived, its header says " + std::to_string(frame.size() - 32) + " (truncated)");
  expect_error(report, [&] { decode(frame.substr(0, 10)); }, "10 bytes arrived, fewer than the 32-byte header");
  expect_error(report, [&] { decode(std::string()); }, "0 bytes arrived");
  std::string flipped = frame;
  flipped[frame.size() / 2] ^= 0x10;
  expect_error(report, [&] { decode(flipped); }, "payload bytes do not match their checksum");
  std::string foreign = frame;
  foreign[0] = 'X';
  expect_error(report, [&] { decode(foreign); }, "does not start with ddp's object header");
  const std::string bytes = ddp::internal::frame_object(ddp::internal::ObjectKind::kBytes, "abc", 3);
  expect_error(report, [&] { decode(bytes); }, "it holds raw bytes, expected an IValue");
  // Intact frames of payloads that are not pickles: the unpickler's error,
  // wrapped, never a crash.
  for (const std::string& garbage : {std::string("\x80\x02garbage"), std::string(100, '\xff'), std::string("K"),
                                     frame.substr(32, (frame.size() - 32) / 2)}) {
    const std::string framed = ddp::internal::frame_object(ddp::internal::ObjectKind::kIValue, garbage.data(),
                                                           garbage.size());
    expect_error(report, [&] { decode(framed); }, "the object from rank 1 does not unpickle");
  }
  report.end_case();
}

// send_object_list / recv_object_list between rank 0 and the last rank,
// both ways, then a receiver whose list is one too short.
void object_p2p(Report& report, int rank, int world) {
  report.begin_case("send_object_list / recv_object_list, and a list of the wrong length");
  const int last = world - 1;
  const std::vector<c10::IValue> sent = {object_of(0), std::string("to the last rank"), c10::IValue()};
  if (rank == 0) {
    ddp::send_object_list(sent, last);
    std::vector<std::string> back(2);
    report.expect(ddp::recv_bytes_list(back, last) == last, "recv_bytes_list did not return its src");
    report.expect(back == std::vector<std::string>{bytes_of(last), std::string()}, "recv_bytes_list differs");
    ddp::send_object_list({c10::IValue(int64_t{1}), c10::IValue(int64_t{2})}, last);
  } else if (rank == last) {
    std::vector<c10::IValue> received(3);
    report.expect(ddp::recv_object_list(received, 0) == 0, "recv_object_list did not return its src");
    std::string why;
    report.expect(is_object_of(received[0], 0, why), "recv_object_list's object 0: " + why);
    report.expect(received[1].isString() && received[1].toStringRef() == "to the last rank" && received[2].isNone(),
                  "recv_object_list's objects 1 and 2 differ");
    ddp::send_bytes_list({bytes_of(last), std::string()}, 0);
    std::vector<c10::IValue> short_list(1);
    expect_error(report, [&] { ddp::recv_object_list(short_list, 0); },
                 "recv_object_list: rank 0 sent 2 objects, but object_list has 1 elements");
  }
  expect_error(report, [&] { ddp::send_object_list({c10::IValue()}, rank); },
               "send_object_list: dst " + std::to_string(rank) + " is this rank itself");
  std::vector<c10::IValue> one(1);
  expect_error(report, [&] { ddp::recv_object_list(one, world + 2); },
               "recv_object_list: src rank " + std::to_string(world + 2) + " is not a rank of the group");
  // The pair stayed in step: the default group still exchanges.
  auto token = torch::ones({1});
  ddp::default_process_group()->allreduce(token)->wait();
  report.expect(token.item<float>() == world, "the group is not usable after the errors");
  report.end_case();
}

void batch_p2p(Report& report, int rank, int world) {
  report.begin_case("batch_isend_irecv: a two-way ring, posted in different orders");
  const int right = (rank + 1) % world;
  const int left = (rank + world - 1) % world;
  auto from_left = torch::zeros({1000});
  auto from_right = torch::zeros({1000});
  std::vector<ddp::P2POp> ops = {
      ddp::P2POp::irecv(from_left, left),
      ddp::P2POp::irecv(from_right, right, nullptr, 1),
      ddp::P2POp::isend(torch::full({1000}, 1.0 * rank), right),
      ddp::P2POp::isend(torch::full({1000}, 100.0 + rank), left, nullptr, 1),
  };
  if (rank % 2 == 1) {
    std::reverse(ops.begin(), ops.end()); // sends first on odd ranks
  }
  auto works = ddp::batch_isend_irecv(ops);
  report.expect(works.size() == ops.size(), "one Work per op");
  for (auto& work : works) {
    work->wait();
  }
  report.expect(torch::equal(from_left, torch::full({1000}, 1.0 * left)), "from the left differs");
  report.expect(torch::equal(from_right, torch::full({1000}, 100.0 + right)), "from the right differs");
  // Sends first everywhere: each rank's send completes only once its peer
  // posts the receive, which a blocking send would never reach.
  std::vector<ddp::P2POp> sends_first = {ddp::P2POp::isend(torch::full({1 << 20}, 1.0 * rank), right),
                                         ddp::P2POp::irecv(from_left = torch::zeros({1 << 20}), left)};
  for (auto& work : ddp::batch_isend_irecv(sends_first)) {
    work->wait();
  }
  report.expect(torch::equal(from_left, torch::full({1 << 20}, 1.0 * left)), "4 MiB from the left differs");
  report.end_case();

  report.begin_case("batch_isend_irecv on a subgroup, peers as global ranks");
  auto pair = ddp::new_group({0, world - 1});
  if (ddp::is_member(pair)) {
    const int other = rank == 0 ? world - 1 : 0;
    auto got = torch::zeros({3});
    for (auto& work : ddp::batch_isend_irecv({ddp::P2POp::isend(torch::full({3}, 7.0 * rank), other, pair),
                                             ddp::P2POp::irecv(got, other, pair)})) {
      work->wait();
    }
    report.expect(torch::equal(got, torch::full({3}, 7.0 * other)), "the subgroup's exchange differs");
  }
  report.end_case();

  report.begin_case("batch_isend_irecv errors name the rank and the op");
  const std::string me = "[rank " + std::to_string(rank) + "/" + std::to_string(world) + "] batch_isend_irecv";
  expect_error(report, [&] { ddp::batch_isend_irecv({}); }, me + ": the list of P2POps is empty");
  expect_error(report, [&] { ddp::batch_isend_irecv({ddp::P2POp::isend(torch::ones({1}), world + 2)}); },
               me + ": ops[0] (isend) names peer " + std::to_string(world + 2) + ", which is not a rank of the group");
  expect_error(report, [&] { ddp::batch_isend_irecv({ddp::P2POp::irecv(torch::ones({1}), rank)}); },
               "ops[0] (recv) names this rank itself");
  auto everyone = ddp::new_group(ddp::group_ranks(ddp::default_process_group()));
  expect_error(report,
               [&] {
                 ddp::batch_isend_irecv({ddp::P2POp::isend(torch::ones({1}), right),
                                         ddp::P2POp::irecv(torch::ones({1}), left, everyone)});
               },
               me + ": ops[1] uses another group than ops[0]");
  expect_error(report,
               [&] { ddp::batch_isend_irecv({ddp::P2POp::isend(torch::ones({1}), right, nullptr, -3)}); },
               "ops[0] has tag -3");
  // Nothing was posted: the default group still exchanges.
  auto token = torch::ones({1});
  ddp::default_process_group()->allreduce(token)->wait();
  report.expect(token.item<float>() == world, "the group is not usable after the errors");
  report.end_case();

  report.begin_case("object collectives: bad roots and lists");
  std::vector<c10::IValue> one(1);
  expect_error(report, [&] { ddp::broadcast_object_list(one, world + 5); },
               "broadcast_object_list: src rank " + std::to_string(world + 5) + " is not a rank of the group");
  expect_error(report, [&] { ddp::gather_object(c10::IValue(), nullptr, rank); },
               "gather_object: this rank is dst (" + std::to_string(rank) + ") and needs a list");
  std::vector<c10::IValue> none;
  expect_error(report, [&] { ddp::scatter_object_list(none, {}, 0); },
               "scatter_object_list: the output list is empty");
  report.end_case();
}

// --dump PREFIX: what pytorch_objects_parity.py compares with PyTorch's
// own calls (pytorch_objects_reference.py), pickled into PREFIX.rank<r>.pt.
void dump(const std::string& prefix, int rank, int world) {
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  std::vector<c10::IValue> gathered;
  ddp::all_gather_object(gathered, object_of(rank));
  out.insert("all_gather_object", list_of(gathered));
  std::vector<c10::IValue> list = {c10::IValue(), c10::IValue()};
  if (rank == world - 1) {
    list = {object_of(rank), std::string("from the last rank")};
  }
  ddp::broadcast_object_list(list, world - 1);
  out.insert("broadcast_object_list", list_of(list));
  std::vector<c10::IValue> at_root;
  ddp::gather_object(object_of(rank), rank == 0 ? &at_root : nullptr, 0);
  out.insert("gather_object", list_of(at_root));
  std::vector<c10::IValue> inputs, scattered(1);
  for (int r = 0; rank == 0 && r < world; ++r) {
    inputs.push_back(object_of(r));
  }
  ddp::scatter_object_list(scattered, inputs, 0);
  out.insert("scatter_object_list", scattered[0]);
  // send_object_list / recv_object_list: rank 0 to the last rank, which
  // keeps the objects and the sender that recv_object_list returned.
  std::vector<c10::IValue> p2p;
  if (rank == 0) {
    ddp::send_object_list({object_of(0), std::string("to the last rank"), c10::IValue()}, world - 1);
  } else if (rank == world - 1) {
    p2p.resize(3);
    p2p.push_back(static_cast<int64_t>(ddp::recv_object_list(p2p, 0)));
  }
  out.insert("send_object_list", list_of(p2p));
  // all_to_all_single with the collective sweep's uneven splits (count 3).
  ddp::AlltoallOptions splits;
  std::vector<at::Tensor> blocks;
  for (int r = 0; r < world; ++r) {
    const int64_t rows = (rank + 2 * r) % 3 + 3;
    splits.input_split_sizes.push_back(rows);
    splits.output_split_sizes.push_back((r + 2 * rank) % 3 + 3);
    blocks.push_back((torch::arange(rows * 2, torch::kDouble) + (rank * 1e9 + r * 1e7)).view({rows, 2}));
  }
  int64_t received = 0;
  for (const int64_t rows : splits.output_split_sizes) {
    received += rows;
  }
  auto output = torch::empty({received, 2}, torch::kDouble);
  ddp::default_process_group()->alltoall(output, torch::cat(blocks), splits)->wait();
  out.insert("all_to_all_single", output);
  // batch_isend_irecv: the two-way ring.
  const int right = (rank + 1) % world;
  const int left = (rank + world - 1) % world;
  auto from_left = torch::zeros({4});
  auto from_right = torch::zeros({4});
  for (auto& work : ddp::batch_isend_irecv({ddp::P2POp::irecv(from_left, left),
                                            ddp::P2POp::irecv(from_right, right, nullptr, 1),
                                            ddp::P2POp::isend(torch::full({4}, 1.0 * rank), right),
                                            ddp::P2POp::isend(torch::full({4}, 100.0 + rank), left, nullptr, 1)})) {
    work->wait();
  }
  out.insert("ring", c10::List<at::Tensor>({from_left, from_right}));
  ddp_test::write_rank_pickle(out, prefix, rank);
}

} // namespace

int main(int argc, char** argv) {
  try {
    torch::set_num_threads(1);
    auto group = ddp::init_process_group();
    if (argc == 3 && std::string(argv[1]) == "--dump") {
      dump(argv[2], group->rank(), group->size());
      ddp::destroy_process_group();
      return 0;
    }
    const int rank = group->rank();
    const int world = group->size();
    Report report("objects_main (rank " + std::to_string(rank) + " of " + std::to_string(world) + ")");
    ivalues(report, rank, world);
    raw_bytes(report, rank, world);
    damaged_frames(report);
    if (world > 1) {
      batch_p2p(report, rank, world);
      object_p2p(report, rank, world);
    }
    const int status = report.finish();
    ddp::destroy_process_group();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "objects_main: %s\n", e.what());
    return 1;
  }
}
