#include "comm/collective_sweep.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <utility>

namespace ddp::testing {

namespace {

const std::vector<at::ScalarType> kFloating = {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16};
const std::vector<at::ScalarType> kIntegral = {at::kChar, at::kByte, at::kShort, at::kInt, at::kLong};

at::Tensor pattern(int64_t count) {
  return torch::arange(count, torch::kLong).remainder(5);
}

// Rank r's input for `op` and the closed-form result, as Long/Double.
std::pair<at::Tensor, at::Tensor> input_and_expected(ReduceOp op, int rank, int world,
                                                     int64_t count, at::ScalarType dtype) {
  const auto p = pattern(count);
  const int64_t w = world;
  if (dtype == at::kBool) {
    // Rank 0 holds true, every other rank false.
    auto input = torch::full({count}, rank == 0, torch::kBool);
    bool expected = false;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMax:
      case ReduceOp::kBor:
      case ReduceOp::kBxor:
        expected = true;
        break;
      default: // PRODUCT, MIN, BAND: true only if every rank holds true
        expected = world == 1;
    }
    return {input, torch::full({count}, expected, torch::kBool)};
  }
  switch (op) {
    case ReduceOp::kSum:
      return {p + rank, p * w + w * (w - 1) / 2};
    case ReduceOp::kAvg:
      return {p + rank, p.to(torch::kDouble) + (w - 1) / 2.0};
    case ReduceOp::kMin:
      return {p + rank, p};
    case ReduceOp::kMax:
      return {p + rank, p + (w - 1)};
    case ReduceOp::kProduct: {
      int64_t factorial = 1;
      for (int64_t k = 2; k <= w; ++k) {
        factorial *= k;
      }
      return {torch::full({count}, rank + 1, torch::kLong), torch::full({count}, factorial, torch::kLong)};
    }
    case ReduceOp::kBand:
      return {torch::full({count}, int64_t{1} << rank, torch::kLong),
              torch::full({count}, w == 1 ? 1 : 0, torch::kLong)};
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      return {torch::full({count}, int64_t{1} << rank, torch::kLong),
              torch::full({count}, (int64_t{1} << w) - 1, torch::kLong)};
  }
  return {};
}

std::vector<ReduceOp> ops_for(at::ScalarType dtype) {
  if (at::isFloatingType(dtype)) {
    return {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax};
  }
  return {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax,
          ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor};
}

std::vector<at::ScalarType> all_dtypes() {
  std::vector<at::ScalarType> dtypes(kFloating);
  dtypes.insert(dtypes.end(), kIntegral.begin(), kIntegral.end());
  dtypes.push_back(at::kBool);
  return dtypes;
}

// ---- The checks ----------------------------------------------------------------

void allreduce_every_dtype_and_op(ProcessGroup& pg, int64_t count) {
  const int rank = pg.rank();
  const int world = pg.size();
  for (auto dtype : all_dtypes()) {
    for (auto op : ops_for(dtype)) {
      auto [input, expected] = input_and_expected(op, rank, world, count, dtype);
      auto tensor = input.to(dtype);
      pg.allreduce(tensor, {op})->wait();
      ASSERT_TRUE(torch::equal(tensor, expected.to(dtype)))
          << "rank " << rank << " dtype " << dtype << " op " << to_string(op);
    }
  }
}

void allreduce_coalesced_matches_separate_sums(ProcessGroup& pg, int64_t count) {
  const int rank = pg.rank();
  const int world = pg.size();
  auto a = torch::full({count}, rank + 1.0);
  auto b = torch::full({2, 3}, 2.0 * rank);
  pg.allreduce_coalesced({a, b})->wait();
  EXPECT_TRUE(torch::equal(a, torch::full({count}, world * (world + 1) / 2.0)));
  EXPECT_TRUE(torch::equal(b, torch::full({2, 3}, 1.0 * world * (world - 1))));
}

void broadcast_from_every_root(ProcessGroup& pg, int64_t count) {
  const int rank = pg.rank();
  for (int root = 0; root < pg.size(); ++root) {
    for (auto dtype : {at::kFloat, at::kHalf, at::kLong, at::kBool}) {
      auto tensor = (pattern(count) + 10 * rank).to(dtype);
      pg.broadcast(tensor, {root})->wait();
      ASSERT_TRUE(torch::equal(tensor, (pattern(count) + 10 * root).to(dtype)))
          << "root " << root << " dtype " << dtype;
    }
  }
}

void reduce_to_every_root(ProcessGroup& pg, int64_t count) {
  const int rank = pg.rank();
  const int world = pg.size();
  for (int root = 0; root < world; ++root) {
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kInt}) {
      auto tensor = (pattern(count) + rank).to(dtype);
      pg.reduce(tensor, {ReduceOp::kSum, root})->wait();
      if (rank == root) {
        ASSERT_TRUE(torch::equal(tensor, (pattern(count) * world + world * (world - 1) / 2).to(dtype)))
            << "root " << root << " dtype " << dtype;
      }
    }
  }
}

void allgather_both_forms(ProcessGroup& pg, int64_t count) {
  const int rank = pg.rank();
  const int world = pg.size();
  auto input = (pattern(count) + 100 * rank).to(torch::kInt);
  std::vector<at::Tensor> outputs;
  for (int r = 0; r < world; ++r) {
    outputs.push_back(torch::empty({count}, torch::kInt));
  }
  pg.allgather(outputs, input)->wait();
  auto flat = torch::empty({world * count}, torch::kInt);
  pg.allgather_into_tensor(flat, input)->wait();
  // In place: the input is this rank's own slot of the output.
  auto in_place = torch::zeros({world * count}, torch::kInt);
  auto own_slot = in_place.narrow(0, rank * count, count);
  own_slot.copy_(input);
  pg.allgather_into_tensor(in_place, own_slot)->wait();
  for (int r = 0; r < world; ++r) {
    auto expected = (pattern(count) + 100 * r).to(torch::kInt);
    ASSERT_TRUE(torch::equal(outputs[r], expected)) << "from rank " << r;
    ASSERT_TRUE(torch::equal(flat.narrow(0, r * count, count), expected)) << "from rank " << r;
    ASSERT_TRUE(torch::equal(in_place.narrow(0, r * count, count), expected))
        << "in place, from rank " << r;
  }
}

void gather_and_scatter(ProcessGroup& pg, int64_t count) {
  const int rank = pg.rank();
  const int world = pg.size();
  const int root = world - 1;
  std::vector<at::Tensor> gathered;
  if (rank == root) {
    for (int r = 0; r < world; ++r) {
      gathered.push_back(torch::empty({count}, torch::kDouble));
    }
  }
  pg.gather(gathered, torch::full({count}, rank * 1.5, torch::kDouble), {root})->wait();
  for (int r = 0; r < static_cast<int>(gathered.size()); ++r) {
    ASSERT_TRUE(torch::equal(gathered[r], torch::full({count}, r * 1.5, torch::kDouble)));
  }

  std::vector<at::Tensor> pieces;
  if (rank == root) {
    for (int r = 0; r < world; ++r) {
      pieces.push_back(pattern(count) * (r + 1));
    }
  }
  auto mine = torch::empty({count}, torch::kLong);
  pg.scatter(mine, pieces, {root})->wait();
  ASSERT_TRUE(torch::equal(mine, pattern(count) * (rank + 1)));
}

void reduce_scatter_and_alltoall(ProcessGroup& pg, int64_t count) {
  const int rank = pg.rank();
  const int world = pg.size();
  std::vector<at::Tensor> inputs;
  for (int r = 0; r < world; ++r) {
    inputs.push_back(torch::full({count}, 1.0f * (r + 1) * (rank + 1)));
  }
  auto output = torch::empty({count});
  pg.reduce_scatter(output, inputs)->wait();
  // sum over ranks q of (rank+1)(q+1) = (rank+1) W(W+1)/2
  ASSERT_TRUE(torch::equal(output, torch::full({count}, (rank + 1.0f) * world * (world + 1) / 2)));

  // In place: the output is this rank's own chunk of the input (read before
  // any peer's part is written there).
  auto whole = torch::empty({world * count});
  std::vector<at::Tensor> chunks;
  for (int r = 0; r < world; ++r) {
    chunks.push_back(whole.narrow(0, r * count, count));
    chunks.back().fill_(1.0f * (r + 1) * (rank + 1));
  }
  pg.reduce_scatter(chunks[rank], chunks)->wait();
  ASSERT_TRUE(torch::equal(chunks[rank], torch::full({count}, (rank + 1.0f) * world * (world + 1) / 2)));

  // reduce_scatter_tensor: the same chunks, stacked as one [world, count]
  // tensor; and AVG.
  auto stacked = torch::empty({world, count});
  for (int r = 0; r < world; ++r) {
    stacked[r].fill_(1.0f * (r + 1) * (rank + 1));
  }
  auto from_stack = torch::empty({count});
  pg.reduce_scatter_tensor(from_stack, stacked)->wait();
  ASSERT_TRUE(torch::equal(from_stack, torch::full({count}, (rank + 1.0f) * world * (world + 1) / 2)));
  pg.reduce_scatter_tensor(from_stack, stacked, {ReduceOp::kAvg})->wait();
  ASSERT_TRUE(torch::allclose(from_stack, torch::full({count}, (rank + 1.0f) * (world + 1) / 2)));

  // Half with MAX: a user-defined reduction for MPI. rank q holds q at every
  // element of chunk r, so the maximum is W - 1 everywhere.
  std::vector<at::Tensor> half_inputs;
  for (int r = 0; r < world; ++r) {
    half_inputs.push_back(torch::full({count}, static_cast<double>(rank), torch::kHalf));
  }
  auto half_output = torch::empty({count}, torch::kHalf);
  pg.reduce_scatter(half_output, half_inputs, {ReduceOp::kMax})->wait();
  ASSERT_TRUE(torch::equal(half_output, torch::full({count}, world - 1.0, torch::kHalf)));

  // Chunk c of rank r's input holds 10r + c; after alltoall, chunk c of
  // this rank's output holds 10c + rank.
  auto input = torch::empty({world * count}, torch::kLong);
  for (int c = 0; c < world; ++c) {
    input.narrow(0, c * count, count).fill_(10 * rank + c);
  }
  auto received = torch::empty({world * count}, torch::kLong);
  pg.alltoall(received, input)->wait();
  for (int c = 0; c < world; ++c) {
    ASSERT_TRUE(torch::equal(received.narrow(0, c * count, count),
                             torch::full({count}, 10 * c + rank, torch::kLong)));
  }
}

// PyTorch's test_reduce_scatter with uneven chunks: inputs[i] has i * count
// elements on every rank, and rank r's output has r * count.
void uneven_reduce_scatter(ProcessGroup& pg, int64_t count) {
  const int rank = pg.rank();
  const int world = pg.size();
  std::vector<at::Tensor> inputs;
  for (int i = 0; i < world; ++i) {
    // Element k of chunk i on rank q: (q + 1) * (k + i).
    inputs.push_back((torch::arange(i * count, torch::kDouble) + i) * (rank + 1));
  }
  auto output = torch::full({rank * count}, -1.0, torch::kDouble);
  auto work = pg.reduce_scatter(output, inputs, {ReduceOp::kSum});
  work->wait();
  // Sum over q of (q + 1) = W(W + 1)/2.
  const auto expected = (torch::arange(rank * count, torch::kDouble) + rank) * (world * (world + 1) / 2.0);
  ASSERT_TRUE(torch::equal(output, expected)) << output;
  ASSERT_TRUE(work->result().at(0).is_same(output));
  auto average = torch::empty({rank * count}, torch::kDouble);
  pg.reduce_scatter(average, inputs, {ReduceOp::kAvg})->wait();
  ASSERT_TRUE(torch::allclose(average, expected / world));
}

// PyTorch's all_to_all_single with split sizes and all_to_all over lists:
// rank s sends rank r rows(s, r) rows of two elements; element j of row k
// holds value(s, r, k, j), so that every received element says where it
// came from.
int64_t uneven_rows(int from, int to, int64_t count) {
  return (from + 2 * to) % 3 + count;
}

double uneven_value(int from, int to, int64_t row, int64_t column) {
  return from * 1e9 + to * 1e7 + row * 2.0 + column;
}

at::Tensor uneven_block(int from, int to, int64_t count) {
  const int64_t rows = uneven_rows(from, to, count);
  return (torch::arange(rows * 2, torch::kDouble) + (from * 1e9 + to * 1e7)).view({rows, 2});
}

void uneven_alltoall(ProcessGroup& pg, int64_t count) {
  const int rank = pg.rank();
  const int world = pg.size();
  std::vector<at::Tensor> sent, expected;
  AlltoallOptions splits;
  for (int r = 0; r < world; ++r) {
    sent.push_back(uneven_block(rank, r, count));
    expected.push_back(uneven_block(r, rank, count));
    splits.input_split_sizes.push_back(uneven_rows(rank, r, count));
    splits.output_split_sizes.push_back(uneven_rows(r, rank, count));
  }
  ASSERT_EQ(uneven_value(1, 2, 3, 1), uneven_block(1, 2, 5)[3][1].item<double>());
  const auto input = torch::cat(sent);
  const auto all_expected = torch::cat(expected);
  auto output = torch::full(all_expected.sizes(), -1.0, torch::kDouble);
  auto work = pg.alltoall(output, input, splits);
  work->wait();
  ASSERT_TRUE(torch::equal(output, all_expected));
  ASSERT_TRUE(work->result().at(0).is_same(output));

  // Only one side given: the other splits evenly (this rank sends each peer
  // count + 1 rows; each receives count + 1 from each).
  AlltoallOptions one_side;
  one_side.output_split_sizes.assign(world, count + 1);
  auto even_input = torch::arange(world * (count + 1), torch::kFloat).add_(1000 * rank);
  auto one_output = torch::empty({world * (count + 1)});
  pg.alltoall(one_output, even_input, one_side)->wait();
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(torch::equal(one_output.narrow(0, r * (count + 1), count + 1),
                             torch::arange(rank * (count + 1), (rank + 1) * (count + 1), torch::kFloat)
                                 .add_(1000 * r)));
  }

  // The list form: any shapes, elements counted.
  std::vector<at::Tensor> outputs;
  for (int r = 0; r < world; ++r) {
    outputs.push_back(torch::empty({2, uneven_rows(r, rank, count)}, torch::kDouble));
  }
  auto list_work = pg.alltoall(outputs, sent);
  list_work->wait();
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(torch::equal(outputs[r], expected[r].reshape({2, -1})));
  }
  ASSERT_TRUE(list_work->result().at(0).is_same(outputs[0]));

  // In place: the output is the input.
  auto same = torch::cat(sent);
  if (torch::equal(torch::tensor(splits.input_split_sizes), torch::tensor(splits.output_split_sizes))) {
    pg.alltoall(same, same, splits)->wait();
    ASSERT_TRUE(torch::equal(same, all_expected));
  }
}

// PyTorch's test_allgather_noncontiguous_input and friends: every operation
// takes strided, transposed and expanded tensors, and writes non-contiguous
// outputs in place. Columns of an [n, 2] matrix are the strided views.
void non_contiguous_arguments(ProcessGroup& pg, int64_t count) {
  const int rank = pg.rank();
  const int world = pg.size();
  const int64_t n = count;
  const auto column = [n](double value) {
    auto matrix = torch::full({n, 2}, -7.0, torch::kDouble);
    auto view = matrix.select(1, 1);
    view.copy_(torch::arange(n, torch::kDouble) + value);
    return std::make_pair(matrix, view);
  };
  // allreduce in place into a column; the other column is untouched.
  {
    auto [matrix, view] = column(rank);
    ASSERT_FALSE(view.is_contiguous() && n > 1);
    auto work = pg.allreduce(view);
    work->wait();
    ASSERT_TRUE(torch::equal(view, torch::arange(n, torch::kDouble) * world + world * (world - 1) / 2.0));
    ASSERT_TRUE(torch::equal(matrix.select(1, 0), torch::full({n}, -7.0, torch::kDouble)));
    ASSERT_TRUE(work->result().at(0).is_same(view));
  }
  // broadcast into a transposed matrix.
  {
    auto target = torch::full({2, n}, 1.0 * rank, torch::kDouble).t();
    if (rank == 0) {
      target.copy_(torch::arange(2 * n, torch::kDouble).reshape({n, 2}));
    }
    pg.broadcast(target, {0})->wait();
    ASSERT_TRUE(torch::equal(target, torch::arange(2 * n, torch::kDouble).reshape({n, 2})));
  }
  // allgather and gather of a column into columns; an expanded input.
  {
    auto [matrix, input] = column(10.0 * rank);
    std::vector<at::Tensor> matrices;
    std::vector<at::Tensor> outputs;
    for (int r = 0; r < world; ++r) {
      matrices.push_back(torch::zeros({n, 2}, torch::kDouble));
      outputs.push_back(matrices.back().select(1, 0));
    }
    pg.allgather(outputs, input)->wait();
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(torch::equal(outputs[r], torch::arange(n, torch::kDouble) + 10.0 * r));
      ASSERT_TRUE(torch::equal(matrices[r].select(1, 1), torch::zeros({n}, torch::kDouble)));
    }
    auto gathered = torch::zeros({world * n, 2}, torch::kDouble);
    pg.allgather_into_tensor(gathered.select(1, 1), torch::full({1}, 1.0 * rank, torch::kDouble).expand({n}))
        ->wait();
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(torch::equal(gathered.select(1, 1).narrow(0, r * n, n), torch::full({n}, 1.0 * r, torch::kDouble)));
    }
    std::vector<at::Tensor> at_root;
    if (rank == world - 1) {
      for (int r = 0; r < world; ++r) {
        at_root.push_back(torch::zeros({2, n}, torch::kDouble).select(0, 1));
      }
    }
    pg.gather(at_root, input, {world - 1})->wait();
    for (size_t r = 0; r < at_root.size(); ++r) {
      ASSERT_TRUE(torch::equal(at_root[r], torch::arange(n, torch::kDouble) + 10.0 * r));
    }
  }
  // scatter from strided inputs into a column; reduce into a column.
  {
    std::vector<at::Tensor> pieces;
    if (rank == 0) {
      for (int r = 0; r < world; ++r) {
        pieces.push_back(column(100.0 * r).second);
      }
    }
    auto [matrix, mine] = column(-1.0);
    pg.scatter(mine, pieces, {0})->wait();
    ASSERT_TRUE(torch::equal(mine, torch::arange(n, torch::kDouble) + 100.0 * rank));
    auto [other, reduced] = column(1.0);
    pg.reduce(reduced, {ReduceOp::kSum, 0})->wait();
    if (rank == 0) {
      ASSERT_TRUE(torch::equal(reduced, (torch::arange(n, torch::kDouble) + 1.0) * world));
    }
  }
  // reduce_scatter from strided inputs into a column; alltoall from a
  // transposed input into a column.
  {
    std::vector<at::Tensor> inputs;
    for (int r = 0; r < world; ++r) {
      inputs.push_back(column(r).second);
    }
    auto [matrix, output] = column(0.0);
    pg.reduce_scatter(output, inputs)->wait();
    ASSERT_TRUE(torch::equal(output, (torch::arange(n, torch::kDouble) + rank) * world));
    // Chunk c of rank q's input holds 10q + c.
    auto input = torch::empty({2, world * n}, torch::kDouble);
    for (int c = 0; c < world; ++c) {
      input.select(0, 1).narrow(0, c * n, n).fill_(10.0 * rank + c);
    }
    auto received = torch::zeros({world * n, 2}, torch::kDouble);
    pg.alltoall(received.select(1, 0), input.select(0, 1))->wait();
    for (int c = 0; c < world; ++c) {
      ASSERT_TRUE(torch::equal(received.select(1, 0).narrow(0, c * n, n),
                               torch::full({n}, 10.0 * c + rank, torch::kDouble)));
    }
  }
  // send and recv: a strided column to the next rank's column.
  if (world > 1) {
    auto [sent_matrix, sent] = column(1000.0 * rank);
    auto [received_matrix, received] = column(-1.0);
    const int next = (rank + 1) % world;
    const int prev = (rank + world - 1) % world;
    auto send = pg.send(sent, next, {3});
    auto recv = pg.recv(received, prev, {3});
    send->wait();
    recv->wait();
    ASSERT_TRUE(torch::equal(received, torch::arange(n, torch::kDouble) + 1000.0 * prev));
    ASSERT_TRUE(torch::equal(received_matrix.select(1, 0), torch::full({n}, -7.0, torch::kDouble)));
  }
  pg.barrier()->wait();
}

void expect_check_error(const std::function<void()>& fn, const std::string& substring) {
  try {
    fn();
    FAIL() << "expected a c10::Error containing '" << substring << "'";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(substring), std::string::npos) << e.what();
  }
}

// Complex tensors, as torch.distributed takes them (Note [Complex
// arguments]): every collective and send/recv moves them, SUM and AVG reduce
// the real and imaginary parts apart, and the other reductions are refused.
// Rank r holds (i % 5) + r + (2 (i % 5) - r) j at element i.
at::Tensor complex_of(const at::Tensor& re, const at::Tensor& im, at::ScalarType dtype) {
  return torch::complex(re.to(torch::kDouble), im.to(torch::kDouble)).to(dtype);
}

at::Tensor complex_input(int64_t count, int rank, at::ScalarType dtype) {
  return complex_of(pattern(count) + rank, pattern(count) * 2 - rank, dtype);
}

void complex_tensors_in_every_collective(ProcessGroup& pg, int64_t count) {
  const int rank = pg.rank();
  const int world = pg.size();
  const double half_sum = world * (world - 1) / 2.0;
  const auto p = pattern(count).to(torch::kDouble);
  const auto sum = complex_of(p * world + half_sum, p * 2 * world - half_sum, torch::kComplexDouble);
  const auto avg = complex_of(p + (world - 1) / 2.0, p * 2 - (world - 1) / 2.0, torch::kComplexDouble);
  const auto as_double = [](const at::Tensor& t) { return t.to(torch::kComplexDouble); };
  for (auto dtype : {at::kComplexFloat, at::kComplexDouble, at::kComplexHalf}) {
    for (auto op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      auto tensor = complex_input(count, rank, dtype);
      auto work = pg.allreduce(tensor, {op});
      work->wait();
      // The result is the caller's tensor, not the real view it travelled as.
      ASSERT_EQ(work->result().size(), 1u);
      ASSERT_TRUE(work->result()[0].is_same(tensor));
      ASSERT_TRUE(torch::allclose(as_double(tensor), op == ReduceOp::kSum ? sum : avg))
          << "allreduce " << to_string(op) << " dtype " << dtype << ": " << tensor;
    }
    const int root = world - 1;
    auto tensor = complex_input(count, rank, dtype);
    pg.broadcast(tensor, {root})->wait();
    ASSERT_TRUE(torch::equal(as_double(tensor), as_double(complex_input(count, root, dtype)))) << dtype;
  }
  const auto dtype = at::kComplexFloat;
  // allreduce_coalesced, one tensor complex and one not (as real views they
  // share a dtype, as in torch.distributed), and a non-contiguous one.
  auto a = complex_input(count, rank, dtype);
  auto b = torch::full({count, 2}, 1.0f * rank);
  pg.allreduce_coalesced({a, b})->wait();
  EXPECT_TRUE(torch::allclose(as_double(a), sum));
  EXPECT_TRUE(torch::equal(b, torch::full({count, 2}, static_cast<float>(half_sum))));
  auto column = torch::zeros({count, 3}, dtype);
  column.select(1, 1).copy_(complex_input(count, rank, dtype));
  pg.allreduce(column.select(1, 1))->wait();
  EXPECT_TRUE(torch::allclose(as_double(column.select(1, 1)), sum));
  EXPECT_TRUE(torch::equal(column.select(1, 0), torch::zeros({count}, dtype)));

  const int root = 0;
  auto reduced = complex_input(count, rank, dtype);
  pg.reduce(reduced, {ReduceOp::kSum, root})->wait();
  if (rank == root) {
    EXPECT_TRUE(torch::allclose(as_double(reduced), sum));
  }
  std::vector<at::Tensor> outputs;
  for (int r = 0; r < world; ++r) {
    outputs.push_back(torch::empty({count}, dtype));
  }
  auto gathered_all = pg.allgather(outputs, complex_input(count, rank, dtype));
  gathered_all->wait();
  ASSERT_EQ(gathered_all->result().size(), outputs.size());
  for (size_t r = 0; r < outputs.size(); ++r) {
    EXPECT_TRUE(gathered_all->result()[r].is_same(outputs[r])) << "allgather's result " << r;
  }
  auto flat = torch::empty({world * count}, dtype);
  pg.allgather_into_tensor(flat, complex_input(count, rank, dtype))->wait();
  std::vector<at::Tensor> gathered;
  if (rank == root) {
    for (int r = 0; r < world; ++r) {
      gathered.push_back(torch::empty({count}, dtype));
    }
  }
  pg.gather(gathered, complex_input(count, rank, dtype), {root})->wait();
  for (int r = 0; r < world; ++r) {
    const auto expected = complex_input(count, r, dtype);
    EXPECT_TRUE(torch::equal(outputs[r], expected)) << "allgather, from rank " << r;
    EXPECT_TRUE(torch::equal(flat.narrow(0, r * count, count), expected)) << "allgather_into_tensor, rank " << r;
    if (rank == root) {
      EXPECT_TRUE(torch::equal(gathered[r], expected)) << "gather, from rank " << r;
    }
  }
  std::vector<at::Tensor> pieces;
  if (rank == root) {
    for (int r = 0; r < world; ++r) {
      pieces.push_back(complex_input(count, 10 * r, dtype));
    }
  }
  auto mine = torch::empty({count}, dtype);
  pg.scatter(mine, pieces, {root})->wait();
  EXPECT_TRUE(torch::equal(mine, complex_input(count, 10 * rank, dtype)));

  // reduce_scatter: every chunk of rank q's input is its complex_input.
  std::vector<at::Tensor> chunks(world, complex_input(count, rank, dtype));
  for (auto op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    auto output = torch::empty({count}, dtype);
    pg.reduce_scatter(output, chunks, {op})->wait();
    EXPECT_TRUE(torch::allclose(as_double(output), op == ReduceOp::kSum ? sum : avg)) << to_string(op);
  }
  // alltoall: chunk c of rank r's input is complex_input(10 r + c).
  auto input = torch::empty({world * count}, dtype);
  for (int c = 0; c < world; ++c) {
    input.narrow(0, c * count, count).copy_(complex_input(count, 10 * rank + c, dtype));
  }
  auto received = torch::empty({world * count}, dtype);
  auto exchanged = pg.alltoall(received, input);
  exchanged->wait();
  EXPECT_TRUE(exchanged->result().at(0).is_same(received));
  for (int c = 0; c < world; ++c) {
    EXPECT_TRUE(torch::equal(received.narrow(0, c * count, count), complex_input(count, 10 * c + rank, dtype)))
        << "alltoall, chunk " << c;
  }
  if (world > 1) {
    const int next = (rank + 1) % world;
    const int prev = (rank + world - 1) % world;
    auto in = torch::empty({count}, dtype);
    auto sent = pg.send(complex_input(count, rank, dtype), next, {3});
    auto got = pg.recv(in, prev, {3});
    sent->wait();
    got->wait();
    EXPECT_TRUE(torch::equal(in, complex_input(count, prev, dtype)));
  }

  // The reductions that are not the parts' own: refused before anything is
  // queued, so the group stays usable.
  const std::string who = "[rank " + std::to_string(rank) + "/" + std::to_string(world) + "] ";
  for (auto op : {ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kBand, ReduceOp::kBor,
                  ReduceOp::kBxor}) {
    const std::string refused = to_string(op) + " is not defined for complex dtype ComplexFloat; only SUM and AVG are";
    expect_check_error([&] { pg.allreduce(complex_input(count, rank, dtype), {op}); },
                       who + "allreduce: " + refused);
    expect_check_error([&] { pg.reduce(complex_input(count, rank, dtype), {op, 0}); }, who + "reduce: " + refused);
    expect_check_error([&] { pg.reduce_scatter(torch::empty({count}, dtype), chunks, {op}); },
                       who + "reduce_scatter: " + refused);
  }
  auto after = torch::ones({2});
  pg.allreduce(after)->wait();
  EXPECT_TRUE(torch::equal(after, torch::full({2}, 1.0 * world)));
}

void send_recv_ring_and_barrier(ProcessGroup& pg, int64_t count) {
  const int rank = pg.rank();
  const int world = pg.size();
  if (world == 1) {
    // No peer to talk to: sending to oneself is an error, not a hang.
    EXPECT_THROW(pg.send(torch::ones({count}), 0), c10::Error);
    pg.barrier()->wait();
    return;
  }
  const int next = (rank + 1) % world;
  const int prev = (rank + world - 1) % world;
  auto out = torch::full({count}, 1.0 * rank);
  auto in = torch::empty({count});
  auto sent = pg.send(out, next, {7});
  auto received = pg.recv(in, prev, {7});
  sent->wait();
  received->wait();
  ASSERT_TRUE(torch::equal(in, torch::full({count}, 1.0 * prev)));
  pg.barrier()->wait();
}


} // namespace

const std::vector<SweepCheck>& sweep_checks() {
  static const std::vector<SweepCheck> checks = {
      {"AllreduceEveryDtypeAndOp", &allreduce_every_dtype_and_op},
      {"AllreduceCoalescedMatchesSeparateSums", &allreduce_coalesced_matches_separate_sums},
      {"BroadcastFromEveryRoot", &broadcast_from_every_root},
      {"ReduceToEveryRoot", &reduce_to_every_root},
      {"AllgatherBothForms", &allgather_both_forms},
      {"GatherAndScatter", &gather_and_scatter},
      {"ReduceScatterAndAlltoall", &reduce_scatter_and_alltoall},
      {"UnevenReduceScatter", &uneven_reduce_scatter},
      {"UnevenAlltoall", &uneven_alltoall},
      {"NonContiguousArguments", &non_contiguous_arguments},
      {"SendRecvRingAndBarrier", &send_recv_ring_and_barrier},
      {"ComplexTensorsInEveryCollective", &complex_tensors_in_every_collective},
  };
  return checks;
}

const std::vector<int64_t>& sweep_counts() {
  static const std::vector<int64_t> counts = {0, 1, 7, (1 << 18) + 3};
  return counts;
}

std::string sweep_case_name(size_t check, int64_t count) {
  return std::string(sweep_checks().at(check).name) + "_N" + std::to_string(count);
}

void check_bad_arguments_are_clear_errors(ProcessGroup& pg) {
  const int rank = pg.rank();
  const int world = pg.size();
  const std::string w = std::to_string(world);
  // An expanded tensor is readable (an input) but cannot hold a result.
  auto expanded = torch::ones({1}).expand({4});
  expect_check_error([&] { pg.allreduce(expanded); },
                     "allreduce: tensor has elements that share memory");
  // Chunks may differ in size; this rank's output has its own chunk's.
  expect_check_error([&] { pg.reduce_scatter(torch::ones({2}),
                                             std::vector<at::Tensor>(world, torch::ones({1}))); },
                     "reduce_scatter: output has 2 elements (sizes [2]), expected 1 like inputs[" +
                         std::to_string(rank) + "]");
  expect_check_error([&] { pg.reduce_scatter_tensor(torch::ones({2}), torch::ones({2 * world + 1})); },
                     "reduce_scatter_tensor: input has " + std::to_string(2 * world + 1) +
                         " elements, expected world size x output elements = " + w + " x 2 = " +
                         std::to_string(2 * world));
  expect_check_error([&] { pg.allreduce(torch::ones({3}, torch::kInt), {ReduceOp::kAvg}); },
                     "AVG is not defined for dtype Int");
  expect_check_error([&] { pg.allreduce(torch::ones({3}), {ReduceOp::kBxor}); },
                     "BXOR is not defined for dtype Float");
  expect_check_error([&] { pg.allreduce_coalesced({torch::ones({3}), torch::ones({3}, torch::kDouble)}); },
                     "tensors[1] has dtype Double, expected Float");
  expect_check_error([&] { pg.broadcast(torch::ones({3}), {world + 3}); },
                     "root rank " + std::to_string(world + 3) + " is out of range for world size " + w);
  expect_check_error([&] { pg.allgather({torch::ones({3})}, torch::ones({3})); },
                     "outputs holds 1 tensors, expected one per rank (" + w + ")");
  std::vector<at::Tensor> uneven(world, torch::ones({3}));
  uneven.back() = torch::ones({4});
  expect_check_error([&] { pg.allgather(uneven, torch::ones({3})); },
                     "outputs[" + std::to_string(world - 1) + "] has 4 elements");
  expect_check_error([&] { pg.send(torch::ones({3}), rank); }, "destination rank");
  expect_check_error([&] { pg.alltoall(torch::ones({2 * world + 1}), torch::ones({2 * world + 1})); },
                     "does not split into " + w + " equal chunks");
  AlltoallOptions bad_splits;
  bad_splits.input_split_sizes.assign(world, 1);
  expect_check_error([&] { pg.alltoall(torch::ones({world}), torch::ones({world + 1}), bad_splits); },
                     "alltoall: input_split_sizes sums to " + w + " rows, but input has " +
                         std::to_string(world + 1));
  bad_splits.input_split_sizes.assign(world + 1, 0);
  expect_check_error([&] { pg.alltoall(torch::ones({world}), torch::ones({0}), bad_splits); },
                     "input_split_sizes has " + std::to_string(world + 1) + " entries, expected " + w);
  bad_splits.input_split_sizes.assign(world, 1);
  bad_splits.input_split_sizes[0] = -1;
  bad_splits.input_split_sizes[1] = 3;
  expect_check_error([&] { pg.alltoall(torch::ones({world}), torch::ones({world + 1}), bad_splits); },
                     "input_split_sizes[0] is -1");
  bad_splits.input_split_sizes.assign(world, 1);
  expect_check_error([&] { pg.alltoall(torch::ones({world, 3}), torch::ones({world, 2}), bad_splits); },
                     "differ past the first dimension");
  expect_check_error([&] { pg.alltoall(std::vector<at::Tensor>(world, torch::ones({2})),
                                       std::vector<at::Tensor>(world + 1, torch::ones({2}))); },
                     "alltoall (lists): got " + std::to_string(world + 1) + " inputs");
  // Split sizes that disagree across ranks: rank 0 expects one row more
  // from rank 1 than rank 1 sends. Every rank fails alike, before any data
  // moves, and the group goes on.
  AlltoallOptions disagree;
  disagree.input_split_sizes.assign(world, 1);
  disagree.output_split_sizes.assign(world, 1);
  if (rank == 0) {
    disagree.output_split_sizes[1] = 2;
  }
  auto disagree_output = torch::zeros({world + (rank == 0 ? 1 : 0)});
  try {
    pg.alltoall(disagree_output, torch::ones({world}), disagree)->wait();
    ADD_FAILURE() << "expected an error for split sizes that disagree";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("the split sizes do not agree: rank 1 sends 1 rows to rank 0 (its "
                                         "input_split_sizes[0]), but rank 0 expects 2 from rank 1 (its "
                                         "output_split_sizes[1])"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(torch::equal(disagree_output, torch::zeros({world + (rank == 0 ? 1 : 0)})));
  expect_check_error([&] { pg.allreduce(torch::ones({3}), {ReduceOp::kSum, std::chrono::milliseconds(0)}); },
                     "timeout must be positive");
  // The group is still usable after argument errors: nothing was queued.
  auto t = torch::ones({2});
  pg.allreduce(t)->wait();
  EXPECT_TRUE(torch::equal(t, torch::full({2}, 1.0 * world)));
}

void check_messages_name_rank_and_operation(ProcessGroup& pg) {
  expect_check_error([&] { pg.allreduce(torch::ones({3}, torch::kComplexFloat), {ReduceOp::kMax}); },
                     "[rank " + std::to_string(pg.rank()) + "/" + std::to_string(pg.size()) +
                         "] allreduce: MAX is not defined for complex dtype ComplexFloat");
}

} // namespace ddp::testing
