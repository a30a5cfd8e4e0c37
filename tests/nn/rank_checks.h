#pragma once

// Checks shared by the DistributedDataParallel programs that run under
// ddprun (tests/nn/*_main.cpp): comparing modules, comparing a rank's
// tensors with rank 0's, and a per-case report that sets the exit status.
//
// A failed check is recorded and the program goes on, so that every rank
// keeps issuing the same collectives; an exception ends the program at once
// (ddprun then stops the other ranks), since a rank that skips the rest of a
// case would leave the others waiting.

#include <torch/torch.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ddp/ddp.h>

namespace ddp_test {

/// The largest absolute difference between same-named parameters of `a` and
/// `b`, and the name where it is; `where` names a missing parameter instead.
struct Difference {
  double value = 0;
  std::string where;
};

inline Difference max_parameter_difference(const torch::nn::Module& a, const torch::nn::Module& b) {
  Difference worst;
  const auto theirs = b.named_parameters();
  for (const auto& item : a.named_parameters()) {
    const auto* other = theirs.find(item.key());
    if (other == nullptr) {
      return {1e30, item.key() + " (missing from the other module)"};
    }
    const double d =
        (item.value().detach().to(torch::kDouble) - other->detach().to(torch::kDouble))
            .abs()
            .max()
            .item<double>();
    if (d > worst.value || worst.where.empty()) {
      worst = {d, item.key()};
    }
  }
  return worst;
}

/// A collective: the largest absolute difference, over all ranks and all of
/// `tensors`, between a rank's tensor and rank 0's. Every rank gets the same
/// answer. Tensors must have the same shapes on every rank.
inline double max_difference_from_rank0(ddp::ProcessGroup& group,
                                        const std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> flat;
  for (const auto& t : tensors) {
    flat.push_back(t.detach().reshape({-1}).to(torch::kDouble));
  }
  if (flat.empty()) {
    return 0;
  }
  auto mine = torch::cat(flat);
  auto reference = mine.clone();
  group.broadcast(reference, {/*root_rank=*/0})->wait();
  auto difference = (mine - reference).abs().max().reshape({1});
  group.allreduce(difference, {ddp::ReduceOp::kMax})->wait();
  return difference.item<double>();
}

/// The parameters (and, with `with_buffers`, the buffers) of `module`.
inline std::vector<torch::Tensor> state_of(const torch::nn::Module& module,
                                           bool with_buffers = true) {
  auto tensors = module.parameters();
  if (with_buffers) {
    for (const auto& b : module.buffers()) {
      tensors.push_back(b);
    }
  }
  return tensors;
}

/// Results of the cases of one program on one rank: one line per case
/// ("[ok] name: detail" or "[FAILED] name: what"), and the exit status.
class Report {
 public:
  explicit Report(std::string program) : program_(std::move(program)) {}

  /// Starts a case; its checks are reported by `end_case`.
  void begin_case(std::string name) {
    case_name_ = std::move(name);
    case_failures_.clear();
    case_notes_.clear();
  }

  /// Records a failure of the current case when `ok` is false.
  void expect(bool ok, const std::string& what) {
    if (!ok) {
      case_failures_.push_back(what);
    }
  }

  /// Records that `value` <= `tolerance`, printing the value in the case line.
  void expect_at_most(double value, double tolerance, const std::string& what) {
    const std::string text = what + " " + format(value) + " (tolerance " + format(tolerance) + ")";
    expect(value <= tolerance, text);
    note(text);
  }

  /// `value` with 3 significant digits.
  static std::string format(double value) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.3g", value);
    return text;
  }

  /// Adds a figure to the case line.
  void note(const std::string& text) {
    case_notes_ += (case_notes_.empty() ? "" : ", ") + text;
  }

  /// Prints the case line.
  void end_case() {
    if (case_failures_.empty()) {
      std::printf("[ok] %s: %s\n", case_name_.c_str(), case_notes_.c_str());
    } else {
      ++failed_;
      for (const auto& failure : case_failures_) {
        std::printf("[FAILED] %s: %s\n", case_name_.c_str(), failure.c_str());
      }
    }
    ++cases_;
    std::fflush(stdout);
  }

  /// Prints the summary; returns the exit status (1 if any case failed).
  /// Prints "<program>: P of N cases passed" (the launched tests check that
  /// line's count) and returns the exit status: 1 when a case failed, or
  /// when no case ran at all (a program whose cases were all skipped proves
  /// nothing), else 0.
  int finish() const {
    std::printf("%s: %d of %d cases passed\n", program_.c_str(), cases_ - failed_, cases_);
    if (cases_ == 0) {
      std::printf("%s: FAILED: no case ran\n", program_.c_str());
    }
    std::fflush(stdout);
    return failed_ == 0 && cases_ > 0 ? 0 : 1;
  }

 private:
  std::string program_;
  std::string case_name_;
  std::vector<std::string> case_failures_;
  std::string case_notes_;
  int cases_ = 0;
  int failed_ = 0;
};

/// Runs `fn` and records a failure of the current case unless it throws a
/// c10::Error containing `substring`.
inline void expect_error(Report& report, const std::function<void()>& fn, const std::string& substring) {
  try {
    fn();
    report.expect(false, "no error; expected one containing '" + substring + "'");
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    report.expect(what.find(substring) != std::string::npos, "error '" + what + "' lacks '" + substring + "'");
  }
}

/// A list IValue of `values` (tensors or IValues), for pickled dumps.
template <typename T>
c10::impl::GenericList list_of(const std::vector<T>& values) {
  c10::impl::GenericList list(c10::AnyType::get());
  for (const auto& v : values) {
    list.push_back(v);
  }
  return list;
}

/// Writes `value` as torch::pickle_save does (what Python's torch.load
/// reads) to `<prefix>.rank<rank>.pt`, for the parity scripts.
inline void write_rank_pickle(const c10::IValue& value, const std::string& prefix, int rank) {
  const auto bytes = torch::pickle_save(value);
  std::ofstream(prefix + ".rank" + std::to_string(rank) + ".pt", std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// `<parent>/<program>_<backend>_<world size>`, created if missing: the
/// files of one run, apart from those of the same program's other tests
/// (on another backend or world size), which ctest may run at the same time.
inline std::string run_directory(const std::string& parent, const std::string& program,
                                 const ddp::ProcessGroup& group) {
  const std::string dir =
      parent + "/" + program + "_" + group.backend_name() + "_" + std::to_string(group.size());
  // (Not std::filesystem: PyPI's LibTorch exports a copy of it that shadows
  // libstdc++'s, PyTorch issue 133437.)
  if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST) {
    throw std::runtime_error("cannot create " + dir + ": " + std::strerror(errno));
  }
  return dir;
}

} // namespace ddp_test
