// Devices in a build without CUDA: none, and a reason that says how to get them.
#include "daemon/device/device_streams.h"
#include "daemon/device/devices.h"

namespace gradsync::daemon {

struct Devices::Allocations {};

Devices Devices::probe() {
  Devices devices;
  devices.summary_ = "built without CUDA (configure with -DGRADSYNC_CUDA=ON): host memory only";
  return devices;
}

bool Devices::built_with_cuda() const {
  return false;
}

std::shared_ptr<const DeviceBuffer> Devices::map(const DeviceHandle& /*handle*/) const {
  throw DeviceError("this gradsyncd serves host memory only: " + summary_);
}

struct ImportedSegments {};

std::shared_ptr<const ImportedSegments> Devices::import_segments(
    std::vector<ipc::UniqueFd> /*fds*/, const std::vector<uint64_t>& /*bytes*/) const {
  throw DeviceError("this gradsyncd serves host memory only: " + summary_);
}

std::shared_ptr<const DeviceBuffer> Devices::map_segments(const DeviceHandle& /*handle*/,
                                                          int /*ordinal*/) const {
  throw DeviceError("this gradsyncd serves host memory only: " + summary_);
}

struct DeviceStreams::State {};

DeviceStreams::DeviceStreams(const Devices& /*devices*/) : state_(std::make_unique<State>()) {}
DeviceStreams::~DeviceStreams() = default;

size_t DeviceStreams::max_operands() {
  return 0;
}

namespace {
[[noreturn]] void no_devices() {
  throw DeviceError("this gradsyncd was built without CUDA: it has no device streams");
}
}  // namespace

void DeviceStreams::reduce(int /*device*/, gradsync_dtype /*dtype*/, gradsync_op /*op*/,
                           const void* const* /*inputs*/, size_t /*num_inputs*/,
                           void* const* /*outputs*/, size_t /*num_outputs*/, size_t /*count*/) {
  no_devices();
}

void DeviceStreams::copy(int /*device*/, void* /*destination*/, const void* /*source*/,
                         size_t /*bytes*/) {
  no_devices();
}

struct ClientEvents {};

std::shared_ptr<const ClientEvents> open_client_events(const Devices& /*devices*/,
                                                       const DeviceUuid& /*device*/,
                                                       const std::vector<IpcEventBytes>& /*ready*/,
                                                       std::vector<IpcEventBytes>& /*completion*/) {
  no_devices();
}

size_t event_slots(const ClientEvents& /*events*/) {
  return 0;
}

int events_device(const ClientEvents& /*events*/) {
  return 0;
}

void DeviceStreams::wait_ready(int /*device*/, const ClientEvents& /*events*/, uint32_t /*slot*/) {
  no_devices();
}

void DeviceStreams::join(int /*into*/, const std::vector<int>& /*devices*/) {
  no_devices();
}

void DeviceStreams::record_completion(const ClientEvents& /*events*/, uint32_t /*slot*/) {
  no_devices();
}

DeviceStreams::Fence DeviceStreams::fence() {
  no_devices();
}

bool DeviceStreams::ready_done(const ClientEvents& /*events*/, uint32_t /*slot*/) {
  no_devices();
}

bool DeviceStreams::take_writes_awaited() {
  return false;
}

bool DeviceStreams::reached(Fence /*fence*/) {
  no_devices();
}

std::shared_ptr<uint8_t> DeviceStreams::pinned(size_t /*bytes*/) {
  no_devices();
}

void DeviceStreams::release_after(Fence /*fence*/,
                                  std::vector<std::shared_ptr<const void>> /*memory*/) {
  no_devices();
}

bool DeviceStreams::pending() const {
  return false;
}

bool DeviceStreams::holding() const {
  return false;
}

bool DeviceStreams::collect() {
  return false;
}

}  // namespace gradsync::daemon
