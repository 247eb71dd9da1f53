// A collective that some of its job's ranks (or nodes) have submitted and others have not: what
// the engine reports, logs and exports while it waits.
#pragma once

#include <string>

namespace gradsync::daemon {

struct Stall {
  double seconds = 0;   // since the first of them submitted it
  std::string message;  // names the tensor, the job and who has not submitted it
};

}  // namespace gradsync::daemon
