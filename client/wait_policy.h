// How a rank waits for its completions: spinning (yielding the core between looks) for a while
// before it sleeps on the futex, or sleeping at once.
//
// Spinning saves the wake-up where the daemon has a core to run on while the rank spins: one
// node, 2 ranks and the daemon on 2 cores, 8 B took 12.6 µs spinning and 31 µs sleeping at once.
// Where the rank and its daemon are confined together to one CPU (a namespace node of
// gradsync-bench --cluster or bench/compare; a container given one core), every look hands
// the core to the daemon and back, and the daemon, which waits on the network, pays two
// context switches each time it polls: 8 B across 2 such nodes took 50 µs spinning and 34 µs
// sleeping at once.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <chrono>

namespace gradsync::client {

inline constexpr std::chrono::microseconds kYieldingSpin{200};

// Whether spinning pays for a rank allowed `rank_cpus` whose daemon is allowed `daemon_cpus`:
// unless both are confined to the same one CPU.
inline bool spinning_pays(const cpu_set_t& rank_cpus, const cpu_set_t& daemon_cpus) {
  cpu_set_t either;
  CPU_OR(&either, &rank_cpus, &daemon_cpus);
  return CPU_COUNT(&either) > 1;
}

// How long this process spins before sleeping, given its daemon's pid: kYieldingSpin, or zero
// where spinning does not pay. Spins where a CPU set cannot be read (the daemon in another PID
// namespace, pid 0).
inline std::chrono::microseconds spin_before_sleeping(pid_t daemon) {
  cpu_set_t rank_cpus;
  cpu_set_t daemon_cpus;
  if (daemon <= 0 || ::sched_getaffinity(0, sizeof(rank_cpus), &rank_cpus) != 0 ||
      ::sched_getaffinity(daemon, sizeof(daemon_cpus), &daemon_cpus) != 0) {
    return kYieldingSpin;
  }
  return spinning_pays(rank_cpus, daemon_cpus) ? kYieldingSpin : std::chrono::microseconds(0);
}

}  // namespace gradsync::client
