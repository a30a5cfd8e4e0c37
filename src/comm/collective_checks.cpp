#include "comm/collective_checks.h"

#include <c10/util/StringUtil.h>

#include "internal/check.h"

namespace ddp::internal {

void check_root(int root, int size, const std::string& who) {
  DDP_CHECK(root >= 0 && root < size, who, ": root rank ", root,
            " is out of range for world size ", size);
}

void check_same_as(const at::Tensor& t, const at::Tensor& reference, const std::string& who,
                   const std::string& what, const std::string& reference_name) {
  DDP_CHECK(t.scalar_type() == reference.scalar_type(), who, ": ", what, " has dtype ",
            t.scalar_type(), ", expected ", reference.scalar_type(), " like ", reference_name);
  DDP_CHECK(t.numel() == reference.numel(), who, ": ", what, " has ", t.numel(),
            " elements (sizes ", t.sizes(), "), expected ", reference.numel(), " like ",
            reference_name, " (sizes ", reference.sizes(), ")");
}

void check_coalesced(const std::vector<at::Tensor>& tensors, const std::string& who,
                     ElementCheck check_element) {
  DDP_CHECK(!tensors.empty(), who, ": no tensors given");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto name = tensors.size() == 1 ? std::string("tensor") : c10::str("tensors[", i, "]");
    check_element(tensors[i], name);
    if (i > 0) {
      DDP_CHECK(tensors[i].scalar_type() == tensors[0].scalar_type(), who, ": ", name,
                " has dtype ", tensors[i].scalar_type(), ", expected ", tensors[0].scalar_type(),
                " like tensors[0]");
      DDP_CHECK(tensors[i].device() == tensors[0].device(), who, ": ", name, " is on ",
                tensors[i].device(), ", expected ", tensors[0].device(), " like tensors[0]");
    }
  }
}

namespace {

// `where` is "" or "on the root, ", for the count message.
void check_list(const std::vector<at::Tensor>& list, int size, const std::string& who,
                const char* where, const char* what, ElementCheck check_element) {
  DDP_CHECK(static_cast<int>(list.size()) == size, who, ": ", where, what, " holds ",
            list.size(), " tensors, expected one per rank (", size, ")");
  for (size_t r = 0; r < list.size(); ++r) {
    check_element(list[r], c10::str(what, "[", r, "]"));
  }
}

} // namespace

void check_one_per_rank(const std::vector<at::Tensor>& list, int size, const std::string& who,
                        const char* what, ElementCheck check_element) {
  check_list(list, size, who, "", what, check_element);
}

void check_root_only_list(const std::vector<at::Tensor>& list, int rank, int root, int size,
                          const std::string& who, const char* what, ElementCheck check_element) {
  if (rank == root) {
    check_list(list, size, who, "on the root, ", what, check_element);
  } else {
    DDP_CHECK(list.empty(), who, ": ", what,
              " must be empty on a rank other than the root (rank ", root, "), got ",
              list.size(), " tensors");
  }
}

} // namespace ddp::internal
