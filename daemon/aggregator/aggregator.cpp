#include "daemon/aggregator/aggregator.h"

#include "daemon/base/log.h"
#include "daemon/links/links.h"
#include "ipc/messages.h"

#include <capnp/message.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <kj/exception.h>

#include <algorithm>
#include <functional>
#include <utility>

namespace gradsync::daemon {
namespace {

// Control messages from nodes are small: a join names the job's nodes and aggregators.
constexpr uint64_t kMessageLimitWords = 64 << 10;

}  // namespace

Aggregator::Aggregator(transport::Transport& transport, metrics::Metrics& metrics,
                       AggregatorSettings settings)
    : transport_(transport),
      metrics_(metrics),
      settings_(std::move(settings)),
      log_(logger("aggregator")) {}

Aggregator::~Aggregator() = default;

void Aggregator::on_message(std::span<const uint8_t> payload, uint64_t tag) {
  try {
    ipc::DecodedMessage decoded(payload, kMessageLimitWords);
    const auto message = decoded.root<wire::AggregationMessage>();
    const std::string name = message.getJob();
    const uint32_t node = message.getNode();
    const uint64_t incarnation = message.getIncarnation();
    if (message.isJoin()) {
      on_join(name, node, incarnation, message.getJoin());
      return;
    }
    const auto it = jobs_.find(name);
    // A job dropped here (its nodes heard why) or an earlier instance of it: nothing to do.
    if (it == jobs_.end() || node >= it->second->shape().nodes.size() ||
        it->second->incarnation(node) != incarnation) {
      log_->debug("job '{}': dropped a message from node {} for no job served here", name, node);
      return;
    }
    if (message.isBatch()) {
      if (auto error =
              it->second->announce(node, message.getBatch(), std::chrono::steady_clock::now())) {
        drop(name, *error);
      }
    } else if (message.isLeave()) {
      const std::string reason = message.getLeave();
      if (reason.empty()) {
        log_->info("job '{}' ended on node {}: no longer served", name, node);
      } else {
        log_->info("job '{}' ended on node {} ({}): no longer served", name, node, reason);
      }
      drop(name, "");
    }
  } catch (const std::exception& e) {
    log_->warn("dropped a malformed message from a node daemon (tag {:#x}): {}", tag, e.what());
  } catch (const kj::Exception& e) {
    log_->warn("dropped a malformed message from a node daemon (tag {:#x}): {}", tag,
               e.getDescription().cStr());
  }
}

void Aggregator::on_join(std::string_view job, uint32_t node, uint64_t incarnation,
                         wire::AggregationJoin::Reader join) {
  AggregatorJob::Shape shape;
  shape.name = job;
  for (auto address : join.getNodes()) shape.nodes.emplace_back(address.cStr());
  shape.index = join.getIndex();
  shape.aggregators = join.getAggregators().size();
  shape.chunk_bytes = join.getChunkBytes();
  shape.tag = tags::job_of_name(shape.name);
  if (node >= shape.nodes.size() || shape.nodes.size() < 2 || shape.nodes.size() > kMaxNodes) {
    log_->warn("job '{}': refused a join from node {} of {} nodes", job, node, shape.nodes.size());
    return;  // no node to answer
  }
  const std::string& sender = shape.nodes[node];
  std::string refusal;
  if (shape.aggregators == 0 || shape.aggregators > aggregation::kMaxAggregators ||
      shape.index >= shape.aggregators) {
    refusal = fmt::format("aggregator {} of {} is not a place in the list", shape.index,
                          shape.aggregators);
  } else if (shape.chunk_bytes < aggregation::kMinChunkBytes ||
             shape.chunk_bytes > aggregation::kMaxChunkBytes) {
    refusal = fmt::format("chunks of {} bytes: this aggregator takes {} to {}", shape.chunk_bytes,
                          aggregation::kMinChunkBytes, aggregation::kMaxChunkBytes);
  }
  auto existing = jobs_.find(job);
  if (refusal.empty() && existing != jobs_.end()) {
    const AggregatorJob::Shape& served = existing->second->shape();
    const bool same = served.nodes == shape.nodes && served.index == shape.index &&
                      served.aggregators == shape.aggregators &&
                      served.chunk_bytes == shape.chunk_bytes;
    uint64_t& known = existing->second->incarnation(node);
    if (same && (known == 0 || known == incarnation)) {
      known = incarnation;  // another node of the job, or the same join again
      return;
    }
    if (same) {
      // The node's next instance of the job (its name taken again): the earlier one is over.
      log_->info("job '{}': node {} joined again as a new instance", job, node);
      drop(std::string(job), "");
      existing = jobs_.end();
    } else {
      refusal = fmt::format("this aggregator serves a job '{}' of the nodes [{}] already", job,
                            fmt::join(served.nodes, ", "));
    }
  }
  if (refusal.empty()) {
    for (const auto& [other, served] : jobs_) {
      if (served->shape().tag == shape.tag) {
        refusal = fmt::format("its name hashes as job '{}''s does: rename one", other);
      }
    }
  }
  if (!refusal.empty()) {
    log_->warn("job '{}': refused node {} ({}): {}", job, node, sender, refusal);
    refuse(sender, job, incarnation, refusal);
    return;
  }
  for (const std::string& address : shape.nodes) shape.peers.push_back(transport_.connect(address));
  log_->info("job '{}': serving its {} nodes as aggregator {} of {}, chunks of {} bytes", job,
             shape.nodes.size(), shape.index, shape.aggregators, shape.chunk_bytes);
  auto served = std::make_unique<AggregatorJob>(std::move(shape), transport_);
  served->incarnation(node) = incarnation;
  jobs_.emplace(std::string(job), std::move(served));
}

bool Aggregator::progress(std::chrono::steady_clock::time_point now) {
  bool moved = false;
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    const auto result = it->second->progress(now, settings_.peer_timeout);
    moved |= result.moved;
    if (result.error) {
      const std::string name = (it++)->first;
      drop(name, *result.error);
      moved = true;
      continue;
    }
    ++it;
  }
  return moved;
}

void Aggregator::on_peer_failed(transport::PeerId peer, const std::string& why) {
  std::vector<std::pair<std::string, std::string>> failed;
  for (const auto& [name, job] : jobs_) {
    const auto& peers = job->shape().peers;
    const auto it = std::find(peers.begin(), peers.end(), peer);
    if (it == peers.end()) continue;
    const auto node = static_cast<size_t>(it - peers.begin());
    failed.emplace_back(
        name, fmt::format("node {} ({}) of the job {}", node, job->shape().nodes[node], why));
  }
  for (const auto& [name, error] : failed) drop(name, error);
}

void Aggregator::drop(const std::string& name, const std::string& error) {
  const auto it = jobs_.find(name);
  if (it == jobs_.end()) return;
  AggregatorJob& job = *it->second;
  if (!error.empty()) {
    log_->warn("job '{}' failed here: {}", name, error);
    for (uint32_t node = 0; node < job.shape().nodes.size(); ++node) {
      if (!transport_.failed(job.shape().peers[node]) && job.incarnation(node) != 0) {
        refuse(job.shape().nodes[node], name, job.incarnation(node), error);
      }
    }
  }
  log_->info("job '{}' dropped: no longer served, its buffers freed", name);
  metrics_.aggregator_job_ended(name);
  jobs_.erase(it);  // its collectives' operations retire with their memory
}

void Aggregator::refuse(const std::string& address, std::string_view job, uint64_t incarnation,
                        const std::string& error) {
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<wire::AggregationMessage>();
  root.setJob(std::string(job));
  root.setIncarnation(incarnation);
  root.setError(error);
  root.setFrom(settings_.address);
  transport_.post(transport_.connect(address),
                  tags::make(tags::kAggregation, 0, tags::job_of_name(job), 0),
                  std::make_shared<const std::vector<uint8_t>>(ipc::encode(message)));
}

bool Aggregator::busy() const {
  return std::any_of(jobs_.begin(), jobs_.end(),
                     [](const auto& job) { return job.second->busy(); });
}

void Aggregator::on_unexpected_pushes(const std::vector<uint64_t>& push_tags) {
  std::vector<std::pair<std::string, std::string>> failed;
  size_t unserved = 0;
  for (const uint64_t tag : push_tags) {
    const uint16_t job_tag = tags::job_of(tag);
    const uint32_t node = tags::node_of(tag);
    const auto it = std::find_if(jobs_.begin(), jobs_.end(), [&](const auto& job) {
      return job.second->shape().tag == job_tag;
    });
    if (it == jobs_.end()) {
      ++unserved;
      continue;
    }
    failed.emplace_back(
        it->first,
        fmt::format("node {} pushed a chunk it did not announce (tag {:#x})", node, tag));
  }
  if (unserved > 0) {
    log_->debug("dropped {} pushes of jobs not served here (ended, or never joined)", unserved);
  }
  for (const auto& [name, error] : failed) drop(name, error);
}

std::vector<AggregatorJobView> Aggregator::jobs() const {
  std::vector<AggregatorJobView> views;
  for (const auto& [name, job] : jobs_) {
    const auto& shape = job->shape();
    views.push_back({name, shape.nodes, shape.index, shape.aggregators, shape.chunk_bytes,
                     job->collectives_in_flight(), job->bytes_received(), job->bytes_sent(),
                     job->chunks_summed()});
  }
  return views;
}

void Aggregator::export_metrics() {
  for (auto& [name, job] : jobs_) {
    metrics_.set_aggregator_job(name, {job->bytes_received(), job->bytes_sent(),
                                       job->chunks_summed(), job->pushes_waiting()});
    for (const double seconds : job->take_chunk_waits())
      metrics_.aggregator_chunk_waited(name, seconds);
  }
}

}  // namespace gradsync::daemon
