#include "daemon/links/node_task.h"

#include <exception>
#include <stdexcept>
#include <utility>

namespace gradsync::daemon {

void NodeTask::promise_type::unhandled_exception() {
  try {
    throw;
  } catch (const std::exception& e) {
    result = e.what();
  } catch (...) {
    result = "an unknown exception";
  }
}

NodeTask::NodeTask(NodeTask&& other) noexcept
    : handle_(std::exchange(other.handle_, {})), worked_(std::exchange(other.worked_, false)) {}

NodeTask& NodeTask::operator=(NodeTask&& other) noexcept {
  if (this != &other) {
    if (handle_) handle_.destroy();
    handle_ = std::exchange(other.handle_, {});
    worked_ = std::exchange(other.worked_, false);
  }
  return *this;
}

NodeTask::~NodeTask() {
  if (handle_) handle_.destroy();
}

bool NodeTask::poll() {
  worked_ = false;
  if (handle_.done()) return true;
  NodeWait* waiting = handle_.promise().waiting;
  if (waiting != nullptr && !waiting->ready()) {
    worked_ = waiting->worked();
    return false;
  }
  handle_.promise().waiting = nullptr;
  worked_ = true;
  handle_.resume();
  return handle_.done();
}

}  // namespace gradsync::daemon
