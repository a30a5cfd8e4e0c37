#pragma once

// The collective sweep, one source for every backend: each check takes a
// ProcessGroup, runs on every rank of it with tensors of a given element
// count, and asserts with GoogleTest. The backends' tests run the same
// checks their own way:
//
// - tests/comm/gloo/process_group_gloo_test.cpp: ranks as threads over a
//   HashStore, world size {1, 2, 3, 4};
// - tests/comm/mpi/process_group_mpi_test.cpp: ranks as processes under
//   `mpirun -np {1, 2, 3, 4}` (MPI ranks cannot be threads).
//
// Each is value-parameterised over (check, count) and its world sizes, so a
// check added here runs on every backend. Expected values are in closed
// form: rank r contributes r + (i % 5) at element i, so SUM = W(W-1)/2 +
// W(i % 5), and so on.
//
// Every rank must run the same checks in the same order with the same count
// (they are collectives).

#include <cstdint>
#include <string>
#include <vector>

#include <ddp/comm/process_group.h>

namespace ddp::testing {

// One check of the sweep.
struct SweepCheck {
  // A test name: "AllreduceEveryDtypeAndOp".
  const char* name;
  // Runs the check on this rank of `pg` with `count` elements.
  void (*run)(ProcessGroup& pg, int64_t count);
};

// Every check, in a fixed order.
const std::vector<SweepCheck>& sweep_checks();

// The element counts: 0, 1, odd, and large (past Gloo's 1 MiB segment for
// 4-byte types, and MPI's eager limits).
const std::vector<int64_t>& sweep_counts();

// "AllreduceEveryDtypeAndOp_N7", for test names.
std::string sweep_case_name(size_t check, int64_t count);

// Misuse on a group of at least two ranks: each bad argument raises
// c10::Error with the shared message, and the group stays usable.
void check_bad_arguments_are_clear_errors(ProcessGroup& pg);

// Messages start with "[rank R/W] op".
void check_messages_name_rank_and_operation(ProcessGroup& pg);

} // namespace ddp::testing
