#include <ddp/comm/work.h>

#include <ddp/comm/error.h>

#include "flight_recorder/flight_recorder.h"
#include "internal/check.h"
#include "timeline/timeline.h"

#include <algorithm>

namespace ddp {

namespace {

// How long a wait with the group's timeout gives the operation's own
// deadline to fail it (see Work::wait).
constexpr std::chrono::milliseconds kOperationGrace{2000};

} // namespace

std::shared_ptr<Work> Work::create(
    std::string name,
    std::chrono::milliseconds default_timeout) {
  return std::make_shared<Work>(std::move(name), default_timeout);
}

std::shared_ptr<Work> Work::completed(std::vector<at::Tensor> result) {
  auto work = create("completed work");
  work->set_result(std::move(result));
  return work;
}

Work::Work(std::string name, std::chrono::milliseconds default_timeout)
    : name_(std::move(name)),
      default_timeout_(default_timeout == kUseGroupTimeout ? kDefaultTimeout : default_timeout) {}

Work::~Work() = default;

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool Work::is_success() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !error_;
}

std::exception_ptr Work::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

void Work::wait(std::chrono::milliseconds timeout) {
  const bool group_timeout = timeout == kUseGroupTimeout;
  if (group_timeout) {
    timeout = default_timeout_;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  // A wait that blocks is on the timeline's "waits" track (Note [Timeline]).
  internal::Timeline* timeline = completed_ ? nullptr : internal::Timeline::get();
  const int64_t blocked_at_us = timeline != nullptr ? internal::Timeline::now_us() : 0;
  const auto done = [this] { return completed_; };
  // With the group's timeout, the operation's own deadline (the same
  // length, started when it started) falls due a moment after this wait's:
  // its error says more (which ranks had not reached it, which failed
  // first), so it gets a short grace to arrive.
  if (!completed_cv_.wait_for(lock, timeout, done) &&
      !(group_timeout && completed_cv_.wait_for(lock, std::min(timeout, kOperationGrace), done))) {
    lock.unlock();
    const std::string message = c10::str(
        name_, ": wait timed out after ", timeout.count(),
        " ms; the operation has not completed (a peer may be slow, stuck or "
        "dead, or ranks issued collectives in different orders)");
    internal::dump_flight_recorders(message); // Note [Flight recorder]
    throw TimeoutError(message);
  }
  if (timeline != nullptr) {
    lock.unlock();
    timeline->complete(internal::Timeline::kWaitTrack, "wait: " + name_, blocked_at_us,
                       internal::Timeline::now_us());
    lock.lock();
  }
  if (error_) {
    std::rethrow_exception(error_);
  }
}

std::chrono::steady_clock::time_point Work::completion_time() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completion_time_;
}

const std::vector<at::Tensor>& Work::result() const {
  std::lock_guard<std::mutex> lock(mutex_);
  DDP_CHECK(completed_, name_, ": result() called before the work completed; call wait() first");
  if (error_) {
    std::rethrow_exception(error_);
  }
  return result_;
}

std::shared_ptr<Work> Work::then(
    std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> fn) {
  auto next = create(name_ + " (then)", default_timeout_);
  auto self = shared_from_this();
  auto callback = [self, next, fn = std::move(fn)]() {
    // Runs once `self` has completed; reading its state needs no lock since
    // completion is final.
    if (self->error_) {
      next->set_error(self->error_);
      return;
    }
    try {
      next->set_result(fn(self->result_));
    } catch (...) {
      next->set_error(std::current_exception());
    }
  };
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!completed_) {
      callbacks_.push_back(std::move(callback));
      return next;
    }
  }
  callback();
  return next;
}

void Work::set_result(std::vector<at::Tensor> result) {
  complete(std::move(result), nullptr);
}

void Work::set_error(std::exception_ptr error) {
  DDP_CHECK(error != nullptr, name_, ": set_error needs an exception");
  complete({}, std::move(error));
}

void Work::keep_alive(std::vector<at::Tensor> tensors) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!completed_) {
    for (auto& t : tensors) {
      kept_alive_.push_back(std::move(t));
    }
  }
}

void Work::complete(std::vector<at::Tensor> result, std::exception_ptr error) {
  std::vector<std::function<void()>> callbacks;
  std::vector<at::Tensor> released;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    DDP_CHECK(!completed_, name_, ": completed twice");
    completed_ = true;
    completion_time_ = std::chrono::steady_clock::now();
    result_ = std::move(result);
    error_ = std::move(error);
    callbacks.swap(callbacks_);
    released.swap(kept_alive_);
  }
  completed_cv_.notify_all();
  for (auto& callback : callbacks) {
    callback();
  }
}

} // namespace ddp
