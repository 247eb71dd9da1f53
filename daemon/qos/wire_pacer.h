// Shares the node's inter-node links between its jobs (docs/qos.md). Every bulk send of a job's
// collectives asks the pacer first and goes once granted:
//  - while sends of more than one job are active, grants go in weighted-fair order (FairShare),
//    each job at most at its part of the link's rate (its weight over the active jobs'), and
//    only while the bytes the transport still holds (sends it could not hand to the network
//    yet) are under a window. The rates keep the queue in the pacer rather than in the
//    kernel's socket buffers, whose first-in first-out order would share the link by what
//    each job has queued; the window does the same where the transport holds sends until they
//    are delivered (rendezvous). A job alone is granted at once (work-conserving);
//  - a job with a cap is granted within it, by a token bucket that may run into debt by one
//    send, so that its rate over any second stays at the cap whatever its message size;
//  - a latency-class job's small sends go first, past the window; and while such a job is
//    active on the node (it had a collective within kLatencyActiveFor), the others together
//    are paced below the link (kLatencyLoad), so that no queue builds in the kernel ahead of
//    its messages, which share the link's queue with theirs. An idle one costs them nothing.
// Engine-thread only; the engine's clock is passed in, so that the tests replay exact orders.
#pragma once

#include "daemon/qos/fair_share.h"
#include "daemon/qos/policy.h"
#include "transport/transport.h"

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace gradsync::daemon {

class WirePacer {
 public:
  using Clock = std::chrono::steady_clock;
  using Flow = FairShare::Flow;
  using Ticket = uint64_t;

  // A job whose last send was granted longer ago than this is no longer active.
  // (Longer than a job waits for its peers between two sends on a slow link: while both run,
  // two jobs stay sharing it. When one stops, the other has the link to itself this late.)
  static constexpr auto kActiveFor = std::chrono::milliseconds(500);
  // Past the window, one send is granted anyway when none was for this long: a window full of
  // sends that wait for their peers' receives never stops the jobs for good.
  static constexpr auto kStalledWindow = std::chrono::milliseconds(5);
  // A capped job may send this long at its cap in one burst after a pause.
  static constexpr auto kCapBurst = std::chrono::milliseconds(10);

  // `window_bytes`: how many bytes the transport may hold before shared grants wait.
  explicit WirePacer(uint64_t window_bytes) : window_bytes_(window_bytes) {}

  // The pacer's figure for the link's rate comes from two kinds of sample, each kLinkHeadroom
  // times a rate, so that the link stays full where the pacer sets each job's part:
  //  - from dispatch(), whatever the jobs: where the transport held a backlog for most of two
  //    kBacklogInterval in a row, the link carried less than it was given, and what it
  //    delivered in the second is its rate (the first may count sends the kernel's socket
  //    buffers took at once as the backlog began). One job alone that fills the link gives a
  //    figure this way. A stall (less than a window delivered) gives none, and one sample
  //    lowers the figure by half at most.
  //  - once a second or so (sample()): where two jobs or more sent since the last sample, what
  //    they sent together. Until the pacer has a figure, shared jobs are held by the window
  //    alone: they fill the link, and the first figure is the link's (from the second shared
  //    interval: jobs starting together send little in their first). Later, what they sent
  //    only ever raises the figure: it went through, so the link carries at least that, while
  //    jobs that sent less may have had less to send. Paced below the link, they send what
  //    the pacer allows, and the figure grows; held back by the link, they send what it
  //    carries, and the figure settles just above it. Only a backlog lowers it.
  // (The links the jobs measured as they formed are no guide: a short probe on a shared host
  // reads them low.)
  void sample(Clock::time_point now);
  static constexpr double kLinkHeadroom = 1.1;
  static constexpr auto kBacklogInterval = std::chrono::milliseconds(500);
  static constexpr double kBackloggedPart = 0.9;
  // While a latency-class job runs: the other jobs' load on the link, together. Their sends
  // go a piece at a time, and much closer to the link the queue the pieces build in the kernel
  // no longer drains between them (docs/decisions/0021-the-link-figure-from-one-job.md).
  static constexpr double kLatencyLoad = 0.7;
  // A latency-class job protects its messages this long after its last collective: through
  // its pauses between steps, not through a long idle spell. (Its first collectives after one
  // may wait for the queue the others built, until it drains.)
  static constexpr auto kLatencyActiveFor = std::chrono::seconds(10);
  double link_rate() const { return link_rate_; }
  // What the link was measured to carry, without the headroom (0: not yet).
  double measured_link_rate() const { return link_rate_ / kLinkHeadroom; }
  // For the tests: a figure as a sample would set it.
  void set_link_rate(double bytes_per_second) {
    link_rate_ = bytes_per_second;
    link_rate_sampled_ = bytes_per_second > 0;
  }

  // Adds the flow (a job), or changes its share from its next grant on.
  void set_share(Flow flow, const JobShare& share);
  // Drops the flow with its requests (its tasks are gone).
  void remove(Flow flow);
  // The flow's job had a collective on the node (most of a latency-class job's travel with its
  // negotiation, never asking the pacer).
  void note_collective(Flow flow, Clock::time_point now);

  // A send of `bytes` by `flow` waits for its grant.
  Ticket request(Flow flow, uint64_t bytes, Clock::time_point now);
  // Grants what may go now; `load`: the transport's sends (held, and what it carried).
  void dispatch(Clock::time_point now, const transport::SendLoad& load);
  // Whether the ticket was granted; a granted ticket is then forgotten.
  bool take_grant(Ticket ticket);
  // A request given up on before its grant (its task was destroyed).
  void cancel(Ticket ticket);

  struct FlowCounters {
    uint64_t granted_bytes = 0;  // sends granted, in bytes
    double waited_seconds = 0;   // time with at least one request waiting
  };
  // Up to `now`; zero for a flow never seen.
  FlowCounters counters(Flow flow, Clock::time_point now) const;
  size_t waiting() const { return requests_.size(); }

 private:
  struct Request {
    Flow flow;
    uint64_t bytes;
  };
  // Bytes a flow may send at `rate`: full (a burst of kCapBurst) on first look, refilled at
  // the rate whether it sends or not, never past the burst; a send may take it into debt,
  // which is paid off at the rate before the next.
  struct TokenBucket {
    double tokens = 0;
    Clock::time_point refilled{};  // never: full on the next look
    bool allows(double rate, Clock::time_point now);
    void spend(uint64_t bytes) { tokens -= static_cast<double>(bytes); }
  };
  struct FlowState {
    JobShare share;
    std::deque<Ticket> queue;  // its requests, oldest first
    TokenBucket cap;           // capped flows, at their cap
    double part_rate = 0;      // shared: its part of the link, in bytes per second
    TokenBucket part;          // shared, at part_rate
    Clock::time_point last_grant{};
    Clock::time_point last_collective{};
    Clock::time_point waiting_since{};  // while the queue is not empty
    FlowCounters counters;
    uint64_t sampled_bytes = 0;  // counters.granted_bytes at the last sample
  };
  // The flow, added with its share's weight on first sight.
  FlowState& flow_state(Flow id);
  static bool cap_allows(FlowState& flow, Clock::time_point now);
  // Shares the link's rate among the active flows by weight, none above its cap, what a cap
  // leaves going to the others (water-filling); returns how many flows are active.
  size_t share_link(Clock::time_point now, bool protect_latency);
  // Shared: whether the flow's part of the link's rate lets it send now.
  bool part_allows(FlowState& flow, Clock::time_point now) const {
    return link_rate_ <= 0 || flow.part.allows(flow.part_rate, now);
  }
  // Waiting, or granted within kActiveFor.
  static bool active(const FlowState& flow, Clock::time_point now);
  // A latency-class flow whose messages the others give way to now.
  static bool protects_latency(const FlowState& flow, Clock::time_point now);
  void grant(Flow id, FlowState& flow, Clock::time_point now);
  void sample_backlog(Clock::time_point now, const transport::SendLoad& load);

  uint64_t window_bytes_;
  double link_rate_ = 0;
  bool link_rate_sampled_ = false;  // link_rate_ is the pacer's own figure
  uint64_t granted_total_ = 0;      // every flow's, ever
  uint64_t sampled_total_ = 0;      // granted_total_ at the last sample
  Clock::time_point sampled_at_{};
  // The backlog samples (dispatch): the last one's load, and whether it was backlogged.
  Clock::time_point backlog_sampled_at_{};
  transport::SendLoad backlog_sampled_;
  bool backlogged_before_ = false;
  bool held_below_link_ = false;  // since the last sample, on purpose (latency class)
  int unpaced_intervals_ = 0;     // shared before the first figure
  FairShare fair_;
  std::map<Flow, FlowState> flows_;               // ordered: ties go to the older job
  std::unordered_map<Ticket, Request> requests_;  // waiting
  std::unordered_set<Ticket> granted_;            // granted, not taken yet
  Ticket next_ticket_ = 1;
  Clock::time_point last_grant_{};  // of any flow
};

}  // namespace gradsync::daemon
