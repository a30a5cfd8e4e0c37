// Fake of src/data/default_placement.cpp; see fake_default_placement.h.

#include "data/fake_default_placement.h"

#include <mutex>

namespace ddp {
namespace {

std::mutex& fake_mutex() {
  static std::mutex mutex;
  return mutex;
}

internal::DefaultPlacement& fake_placement() {
  static internal::DefaultPlacement placement; // Guarded by fake_mutex().
  return placement;
}

} // namespace

void testing::set_fake_default_placement(
    const internal::DefaultPlacement& placement) {
  std::lock_guard<std::mutex> lock(fake_mutex());
  fake_placement() = placement;
}

internal::DefaultPlacement internal::default_placement() {
  std::lock_guard<std::mutex> lock(fake_mutex());
  return fake_placement();
}

} // namespace ddp
