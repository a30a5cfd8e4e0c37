#include "comm/collective_label.h"

#include <utility>

namespace ddp::internal {

namespace {
thread_local std::string label; // this thread's innermost
} // namespace

const std::string& current_collective_label() {
  return label;
}

CollectiveLabel::CollectiveLabel(std::string text) : outer_(std::move(label)) {
  label = std::move(text);
}

CollectiveLabel::~CollectiveLabel() {
  label = std::move(outer_);
}

} // namespace ddp::internal
