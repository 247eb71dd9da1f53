#include "daemon/engine/job.h"

#include "daemon/node/node_job.h"

#include <fmt/format.h>

#include <algorithm>

namespace gradsync::daemon {

Job::Job(std::string name, int32_t local_world_size, Clock::time_point formation_deadline)
    : name_(std::move(name)),
      local_world_size_(local_world_size),
      sessions_(static_cast<size_t>(local_world_size), nullptr),
      formation_deadline_(formation_deadline),
      last_submitted_(static_cast<size_t>(local_world_size), nullptr) {}

Job::~Job() = default;

void Job::set_network(std::unique_ptr<NodeJob> network) {
  network_ = std::move(network);
  network_->set_step_meter(&steps_);
  network_->set_unit_pool(&unit_pool_);
}

void Job::start_autotune(const TunedSettings& start, const AutotuneLimits& limits,
                         Clock::time_point now) {
  autotuner_.emplace(start, limits, now);
  if (network_) network_->announce({autotuner_->current(), autotuner_->done()});
}

const TunedSettings* Job::tuned() const {
  if (network_) return network_->formed() ? &network_->tuned() : nullptr;
  return autotuner_ ? &autotuner_->current() : nullptr;
}

void Job::tune(const StepMeter::Step& step, Clock::time_point now) {
  const bool changed = autotuner_->on_step(step.bus_bytes, step.seconds, now);
  // Across nodes: announced with every change, and once more when the search ends.
  if (network_ && (changed || autotuner_->done())) {
    network_->announce({autotuner_->current(), autotuner_->done()});
  }
}

std::vector<AutotuneTrial> Job::take_autotune_events() {
  std::vector<AutotuneTrial> events;
  if (!autotuner_) return events;
  const auto& trials = autotuner_->trials();
  events.assign(trials.begin() + static_cast<std::ptrdiff_t>(autotune_events_), trials.end());
  autotune_events_ = trials.size();
  if (autotuner_->done() && !autotune_choice_taken_) {
    autotune_choice_taken_ = true;
    events.push_back(
        {0, 0, autotuner_->current(), 0, autotuner_->best_bus_bytes_per_second(), true});
  }
  return events;
}

void Job::attach(Session& session) {
  sessions_.at(static_cast<size_t>(session.identity().local_rank)) = &session;
  session.job = this;
  formed_ = formed_ || std::none_of(sessions_.begin(), sessions_.end(),
                                    [](const Session* s) { return s == nullptr; });
}

bool Job::formed() const {
  return formed_ && (!network_ || network_->formed());
}

bool Job::check_formation(Clock::time_point now) {
  if (formed() || failure_ || now < formation_deadline_) return false;
  if (formed_) {
    fail(GRADSYNC_ERR_TIMEOUT,
         fmt::format("job '{}' did not form across nodes: {} never joined (not all of its ranks "
                     "connected in time)",
                     name_, network_->missing_nodes()));
    return true;
  }
  std::string missing;
  for (size_t r = 0; r < sessions_.size(); ++r) {
    if (sessions_[r] == nullptr) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  fail(GRADSYNC_ERR_TIMEOUT,
       fmt::format("job '{}' did not form: local ranks {} of {} never connected", name_, missing,
                   local_world_size_));
  return true;
}

void Job::detach(Session& session, const std::string& reason) {
  const auto rank = static_cast<size_t>(session.identity().local_rank);
  if (sessions_.at(rank) != &session) return;
  // Drop the leaving rank's own work first: it has nobody to complete to.
  for (auto& [name, tensor] : pending_) tensor.per_rank[rank].clear();
  sessions_[rank] = nullptr;
  session.job = nullptr;
  fail(GRADSYNC_ERR_PEER_FAILED, reason);
}

std::vector<int32_t> Job::ranks() const {
  std::vector<int32_t> ranks;
  for (const Session* s : sessions_) {
    if (s != nullptr) ranks.push_back(s->identity().rank);
  }
  return ranks;
}

int32_t Job::world_size() const {
  return network_ ? network_->layout().world_size : local_world_size_;
}

void Job::rank_progress(std::vector<uint64_t>& submitted, std::vector<uint64_t>& completed) const {
  submitted.assign(sessions_.size(), 0);
  completed.assign(sessions_.size(), 0);
  for (size_t r = 0; r < sessions_.size(); ++r) {
    if (sessions_[r] != nullptr) {
      submitted[r] = sessions_[r]->submitted();
      completed[r] = sessions_[r]->completed();
    }
  }
}

int32_t Job::connected_ranks() const {
  return static_cast<int32_t>(std::count_if(sessions_.begin(), sessions_.end(),
                                            [](const Session* s) { return s != nullptr; }));
}

std::optional<Stall> Job::oldest_stall(Clock::time_point now, Clock::duration min_age) const {
  const std::string* oldest_name = nullptr;
  const PendingTensor* oldest = nullptr;
  for (const auto& [name, tensor] : pending_) {
    if (!tensor.partly_submitted() || now - tensor.since < min_age) continue;
    if (oldest == nullptr || tensor.since < oldest->since) {
      oldest = &tensor;
      oldest_name = &name;
    }
  }
  if (oldest == nullptr) return std::nullopt;
  return Stall{std::chrono::duration<double>(now - oldest->since).count(),
               stall_message(*oldest_name, *oldest, now - oldest->since)};
}

void Job::warn_stalls(Clock::time_point now, Clock::duration warn_after,
                      std::vector<std::string>& warn) {
  for (auto& [name, tensor] : pending_) {
    if (tensor.partly_submitted() && now - tensor.since >= warn_after && !tensor.warned) {
      tensor.warned = true;
      warn.push_back(stall_message(name, tensor, now - tensor.since));
    }
  }
}

std::string Job::stall_message(const std::string& name, const PendingTensor& tensor,
                               Clock::duration waited) const {
  std::string local;
  std::string global;
  for (size_t r = 0; r < tensor.per_rank.size(); ++r) {
    if (!tensor.per_rank[r].empty()) continue;
    local += fmt::format("{}{}", local.empty() ? "" : ", ", r);
    if (sessions_[r] != nullptr) {
      global += fmt::format("{}{}", global.empty() ? "" : ", ", sessions_[r]->identity().rank);
    }
  }
  return fmt::format(
      "job '{}': tensor '{}' has waited {} s for local rank(s) {} (job rank(s) {}), which have "
      "not submitted it",
      name_, name, std::chrono::duration_cast<std::chrono::seconds>(waited).count(), local, global);
}

bool Job::empty() const {
  for (const Session* s : sessions_) {
    if (s != nullptr) return false;
  }
  return true;
}

void Job::submit(Submission submission, Clock::time_point taken_at) {
  if (failure_) {
    complete(submission, failure_status_, *failure_);
    return;
  }
  const auto rank = static_cast<size_t>(submission.session->identity().local_rank);
  PendingTensor& tensor = find_pending(rank, submission.name);
  auto& queue = tensor.per_rank[rank];
  if (tensor.ranks_waiting == tensor.per_rank.size()) {
    tensor.since = taken_at;  // the first rank to submit this instance
    tensor.warned = false;
  }
  if (!queue.empty() || tensor.ranks_waiting > 1) {
    if (queue.empty()) --tensor.ranks_waiting;
    queue.push_back(std::move(submission));
    return;
  }
  // The last one missing: it goes straight to the collective, the others from their queues.
  std::vector<Submission> ranks = unit_pool_.ranks();
  ranks.reserve(tensor.per_rank.size());
  size_t still_queued = 0;
  auto take_queued = [&](size_t r) {
    auto& q = tensor.per_rank[r];
    ranks.push_back(std::move(q.front()));
    q.pop_front();
    if (!q.empty()) ++still_queued;
  };
  for (size_t r = 0; r < rank; ++r) take_queued(r);
  ranks.push_back(std::move(submission));
  for (size_t r = rank + 1; r < tensor.per_rank.size(); ++r) take_queued(r);
  const Clock::time_point since = tensor.since;
  // A rank may already have submitted the same name for the next step.
  tensor.ranks_waiting = tensor.per_rank.size() - still_queued;
  if (still_queued > 0) {
    tensor.since = taken_at;  // the next instance's wait counts from here
    tensor.warned = false;
  }
  // The entry stays for the next step (names repeat every step: no allocation per step), until
  // too many idle ones pile up (unnamed collectives get a fresh name each time).
  if (pending_.size() > kMaxIdleTensors) {
    forget_submission_order();
    std::erase_if(pending_, [](const auto& entry) {
      return entry.second.ranks_waiting == entry.second.per_rank.size();
    });
  }
  on_all_submitted(std::move(ranks), since, taken_at);
}

Job::PendingTensor& Job::find_pending(size_t rank, const std::string& name) {
  PendingTensor*& last = last_submitted_[rank];
  if (last != nullptr && last->submitted_next != nullptr && *last->submitted_next->name == name) {
    return *(last = last->submitted_next);
  }
  auto [it, inserted] = pending_.try_emplace(name);
  PendingTensor& tensor = it->second;
  if (inserted) {
    tensor.name = &it->first;
    tensor.per_rank.resize(static_cast<size_t>(local_world_size_));
    tensor.ranks_waiting = tensor.per_rank.size();
  }
  if (last != nullptr) last->submitted_next = &tensor;
  return *(last = &tensor);
}

void Job::forget_submission_order() {
  for (auto& [name, tensor] : pending_) tensor.submitted_next = nullptr;
  std::fill(last_submitted_.begin(), last_submitted_.end(), nullptr);
}

void Job::start_trace(std::unique_ptr<TraceRecorder> recorder) {
  trace_ = std::move(recorder);
  if (network_) network_->set_trace(trace_.get());
}

void Job::check_trace(Clock::time_point now) {
  if (!trace_ || !trace_->check_deadline(now)) return;
  if (network_) network_->set_trace(nullptr);
  trace_.reset();
}

void Job::on_all_submitted(std::vector<Submission> ranks, Clock::time_point since,
                           Clock::time_point ready) {
  // For the duration metric, the step meter and the trace. Counted before an invalid
  // submission is taken out below (with a single local rank, none may be left), so that the
  // name need not be copied.
  const TraceTimes times{since, ready, {}};
  if (const auto step = steps_.on_ready(ranks.front().name, times.ready);
      step && autotuner_ && !autotuner_->done()) {
    tune(*step, times.ready);
  }
  if (trace_) trace_->on_ready(ranks.front().name);
  // Local rank 0's, as it submitted them: groups are known by rank 0's id.
  const bool grouped = ranks.front().grouped;
  const uint64_t group_id = ranks.front().group;
  const uint32_t group_size = ranks.front().group_size;
  gradsync_result status = GRADSYNC_OK;
  std::string message;
  for (size_t r = 0; r < ranks.size() && status == GRADSYNC_OK; ++r) {
    if (!ranks[r].valid()) {
      status = GRADSYNC_ERR_INVALID_ARGUMENT;
      message = fmt::format("tensor '{}': local rank {} submitted it invalidly: {}", ranks[r].name,
                            r, ranks[r].error);
      // The sender learns its own reason; the others learn whose submission was bad.
      complete(ranks[r], status, ranks[r].error);
      ranks.erase(ranks.begin() + static_cast<ptrdiff_t>(r));
    }
  }
  if (status == GRADSYNC_OK) {
    if (auto mismatch = find_mismatch(ranks)) {
      status = GRADSYNC_ERR_MISMATCH;
      message = std::move(*mismatch);
    }
  }
  if (!grouped) {
    if (status != GRADSYNC_OK) {
      fail_collective(ranks, status, message);
      return;
    }
    // emplace, not an initializer list: that would copy every submission.
    ReadyUnit& unit = ready_.emplace_back(ReadyUnit{unit_pool_.collectives(), ready_count_++});
    unit.collectives.push_back(ReadyCollective{std::move(ranks), times});
    return;
  }
  // A group runs whole or fails whole: one bad member fails the members seen so far and every
  // member still to come.
  GroupAssembly& group = groups_[group_id];
  group.expected = group_size;
  ++group.seen;
  if (status != GRADSYNC_OK && !group.failure) {
    group.failure = std::make_pair(status, message);
    for (auto& c : group.unit.collectives) fail_collective(c.ranks, status, message);
    group.unit.collectives.clear();
  }
  if (group.failure) {
    fail_collective(ranks, group.failure->first, group.failure->second);
  } else {
    group.unit.collectives.push_back(ReadyCollective{std::move(ranks), times});
  }
  if (group.seen == group.expected) {
    if (!group.failure) {
      group.unit.order = ready_count_++;
      ready_.push_back(std::move(group.unit));
    }
    groups_.erase(group_id);
  }
}

size_t Job::fail_collective(std::vector<Submission>& ranks, gradsync_result status,
                            const std::string& message) {
  for (auto& s : ranks) complete(s, status, message);
  const size_t failed = ranks.size();
  ranks.clear();
  return failed;
}

size_t Job::fail(gradsync_result status, const std::string& message) {
  if (!failure_) {
    failure_ = message;
    failure_status_ = status;
  }
  size_t failed = 0;
  for (auto& [name, tensor] : pending_) {
    for (auto& queue : tensor.per_rank) {
      for (auto& s : queue) complete(s, status, message);
      failed += queue.size();
    }
  }
  forget_submission_order();
  pending_.clear();
  auto fail_unit = [&](ReadyUnit& unit) {
    for (auto& c : unit.collectives) failed += fail_collective(c.ranks, status, message);
  };
  for (auto& [id, group] : groups_) fail_unit(group.unit);
  groups_.clear();
  for (auto& unit : ready_) fail_unit(unit);
  ready_.clear();
  if (network_) failed += network_->fail_waiting(status, message);
  return failed;
}

std::optional<std::string> find_mismatch(const std::vector<Submission>& ranks) {
  const Submission& lead = ranks.front();
  for (size_t r = 1; r < ranks.size(); ++r) {
    const Submission& s = ranks[r];
    auto differ = [&](const char* what, const std::string& a, const std::string& b) {
      return fmt::format("tensor '{}': local ranks disagree on {}: rank 0 has {}, rank {} has {}",
                         lead.name, what, a, r, b);
    };
    if (s.collective != lead.collective) {
      return differ("the collective", ipc::collective_name(lead.collective),
                    ipc::collective_name(s.collective));
    }
    if (s.grouped != lead.grouped || s.group_size != lead.group_size) {
      return differ("grouping",
                    lead.grouped ? fmt::format("a group of {}", lead.group_size) : "none",
                    s.grouped ? fmt::format("a group of {}", s.group_size) : "none");
    }
    if (s.priority != lead.priority) {
      return differ("the priority", std::to_string(lead.priority), std::to_string(s.priority));
    }
    if (lead.collective == ipc::Collective::kBarrier) continue;
    // Device collectives run on the daemon's streams, host ones on its CPUs: not both at once.
    if ((s.device == kHostMemory) != (lead.device == kHostMemory)) {
      auto memory = [](const Submission& x) {
        return x.device == kHostMemory ? std::string("host memory") : std::string("device memory");
      };
      return differ("where the data is", memory(lead), memory(s));
    }
    if (s.dtype != lead.dtype) {
      return differ("the dtype", ipc::dtype_name(lead.dtype), ipc::dtype_name(s.dtype));
    }
    if (s.count != lead.count) {
      return differ("the count", std::to_string(lead.count), std::to_string(s.count));
    }
    if (ipc::reduces(lead.collective) && s.op != lead.op) {
      return differ("the op", ipc::op_name(lead.op), ipc::op_name(s.op));
    }
    if (lead.collective == ipc::Collective::kBroadcast && s.root != lead.root) {
      return differ("the root", std::to_string(lead.root), std::to_string(s.root));
    }
  }
  return std::nullopt;
}

}  // namespace gradsync::daemon
