// A piece of work across nodes that waits on the network: a coroutine that runs until it has to
// wait (`co_await flight.wait(...)`, see links.h) and is resumed by whoever polls it once what
// it waits for is done, failed or timed out. The engine keeps several in flight, of one job and
// of many, and goes on serving everything else meanwhile; nothing blocks on a peer.
#pragma once

#include <chrono>
#include <coroutine>
#include <optional>
#include <string>
#include <utility>

namespace gradsync::daemon {

using NodeResult = std::optional<std::string>;  // an error, or nothing

// What a suspended task waits for.
class NodeWait {
 public:
  virtual ~NodeWait() = default;
  // True once the task may go on: what it waits for is done, failed, or took too long.
  virtual bool ready() = 0;
  // Whether the last ready() did work (resumed a task it waits on): the engine counts it.
  virtual bool worked() const { return false; }
};

class NodeTask {
 public:
  struct promise_type {
    NodeResult result;
    NodeWait* waiting = nullptr;

    NodeTask get_return_object() {
      return NodeTask(std::coroutine_handle<promise_type>::from_promise(*this));
    }
    std::suspend_never initial_suspend() noexcept { return {}; }  // runs to its first wait
    std::suspend_always final_suspend() noexcept { return {}; }   // the owner reads the result
    void return_value(NodeResult value) { result = std::move(value); }
    void unhandled_exception();
  };

  NodeTask(NodeTask&& other) noexcept;
  NodeTask& operator=(NodeTask&& other) noexcept;
  NodeTask(const NodeTask&) = delete;
  NodeTask& operator=(const NodeTask&) = delete;
  // Destroying an unfinished task unwinds it: its Flights retire what is still pending.
  ~NodeTask();

  // Resumes the task if what it waits for is ready; true once it has finished.
  bool poll();
  // Whether the last poll did work, finished or not: resumed the task, or a task it waits on.
  bool worked() const { return worked_; }
  bool done() const { return handle_.done(); }
  // Once done.
  const NodeResult& result() const { return handle_.promise().result; }

 private:
  explicit NodeTask(std::coroutine_handle<promise_type> handle) : handle_(handle) {}

  std::coroutine_handle<promise_type> handle_;
  bool worked_ = false;
};

// Awaitable by a NodeTask: suspends it on `wait` unless that is ready already.
template <typename Wait>
struct NodeAwait {
  Wait wait;

  bool await_ready() { return wait.ready(); }
  void await_suspend(std::coroutine_handle<NodeTask::promise_type> task) {
    task.promise().waiting = &wait;
  }
  auto await_resume() { return wait.take_result(); }
};

// Lets the engine go round once (the network progresses) before the task goes on: work of
// its own that the task cuts into pieces overlaps its transfers this way. A task resumed and
// waiting again counts as work done (NodeTask::worked), so the engine does not sleep between
// the pieces.
class RoundWait final : public NodeWait {
 public:
  bool ready() override { return std::exchange(went_round_, true); }
  NodeResult take_result() { return std::nullopt; }

 private:
  bool went_round_ = false;
};

inline NodeAwait<RoundWait> next_round() {
  return {RoundWait{}};
}

// Waits for another task to end: a collective run as one step of a larger piece of work.
class TaskWait final : public NodeWait {
 public:
  explicit TaskWait(NodeTask& task) : task_(&task) {}
  bool ready() override { return task_->poll(); }
  bool worked() const override { return task_->worked(); }
  NodeResult take_result() { return task_->result(); }

 private:
  NodeTask* task_;
};

inline NodeAwait<TaskWait> finish(NodeTask& task) {
  return {TaskWait(task)};
}

// Waits for two tasks that run side by side, both polled each time round: the first error
// either ends with, once both have ended.
class BothWait final : public NodeWait {
 public:
  BothWait(NodeTask& first, NodeTask& second) : first_(&first), second_(&second) {}
  bool ready() override {
    const bool first = first_->poll();
    const bool second = second_->poll();
    return first && second;
  }
  bool worked() const override { return first_->worked() || second_->worked(); }
  NodeResult take_result() { return first_->result() ? first_->result() : second_->result(); }

 private:
  NodeTask* first_;
  NodeTask* second_;
};

inline NodeAwait<BothWait> finish_both(NodeTask& first, NodeTask& second) {
  return {BothWait(first, second)};
}

}  // namespace gradsync::daemon
