#include "transport/ucx.h"

namespace gradsync::transport {
namespace {

// The callbacks release the request themselves: a completed Operation holds no UCX resource
// and may outlive its worker.
void finish_part(Operation::Part* part, void* request, ucs_status_t status) {
  Operation::State* state = part->state;
  ucp_request_free(request);
  part->request = nullptr;
  if (status != UCS_OK && state->status == UCS_OK) state->status = status;
  if (--state->pending > 0) return;
  state->stop_holding(state->status == UCS_OK);
  state->done = true;
}

void on_send(void* request, ucs_status_t status, void* user_data) {
  finish_part(static_cast<Operation::Part*>(user_data), request, status);
}

void on_receive(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                void* user_data) {
  auto* part = static_cast<Operation::Part*>(user_data);
  if (status == UCS_OK && info != nullptr) {
    part->state->received += info->length;
    part->state->sender_tag = info->sender_tag;
  }
  finish_part(part, request, status);
}

}  // namespace

UcxError::UcxError(const std::string& call, ucs_status_t status, const char* file, int line)
    : std::runtime_error(call + ": " + ucs_status_string(status) + " (" + file + ":" +
                         std::to_string(line) + ")"),
      status_(status) {}

Context create_context(const std::vector<std::pair<std::string, std::string>>& settings) {
  ucp_config_t* config = nullptr;
  GRADSYNC_UCX_CHECK(ucp_config_read(nullptr, nullptr, &config));
  for (const auto& [key, value] : settings) {
    const ucs_status_t status = ucp_config_modify(config, key.c_str(), value.c_str());
    if (status != UCS_OK) {
      ucp_config_release(config);
      throw UcxError("ucp_config_modify(" + key + "=" + value + ")", status, __FILE__, __LINE__);
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  ucp_context_h context = nullptr;
  const ucs_status_t status = ucp_init(&params, config, &context);
  ucp_config_release(config);
  GRADSYNC_UCX_CHECK(status);
  return Context(context);
}

Worker create_worker(ucp_context_h context) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  GRADSYNC_UCX_CHECK(ucp_worker_create(context, &params, &worker));
  return Worker(worker);
}

Operation& Operation::operator=(Operation&& other) noexcept {
  if (this != &other) {
    release();
    worker_ = std::exchange(other.worker_, nullptr);
    receive_ = other.receive_;
    state_ = std::move(other.state_);
  }
  return *this;
}

Operation::Operation(ucp_worker_h worker, std::unique_ptr<State> state, bool receive, size_t parts)
    : worker_(worker), receive_(receive), state_(std::move(state)) {
  if (parts > 1) state_->more.resize(parts - 1);
}

ucp_request_param_t Operation::add_part() {
  Part& slot = state_->part(state_->started++);
  slot.state = state_.get();
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  if (receive_) {
    params.cb.recv = on_receive;
    // Always through the callback, the one place that learns what a receive brought: UCX
    // 1.13 leaves recv_info unwritten when a receive completes at once.
    params.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  } else {
    params.cb.send = on_send;
  }
  params.user_data = &slot;
  return params;
}

void Operation::part_started(ucs_status_ptr_t request) {
  if (UCS_PTR_IS_ERR(request)) {
    state_->status = UCS_PTR_STATUS(request);
  } else if (request != nullptr) {  // null: completed at once
    state_->part(state_->started - 1).request = request;
    ++state_->pending;
  }
}

void Operation::all_started() {
  // No callback runs before the worker's next progress, so nothing has finished yet.
  if (state_->pending == 0) {
    state_->done = true;
    if (state_->held != nullptr && state_->status == UCS_OK) {
      state_->held->delivered_at_once(state_->send_bytes);
    }
    state_->held = nullptr;
  } else if (state_->held != nullptr && !receive_) {
    state_->held->add(state_->send_bytes);
  }
}

void Operation::cancel() {
  if (!receive_ || state_ == nullptr) return;
  // A cancel may complete its part on the spot, callback (and its free) included.
  for (size_t i = 0; i < state_->started; ++i) {
    if (void* request = state_->part(i).request) ucp_request_cancel(worker_, request);
  }
}

void Operation::release() {
  if (state_ != nullptr && !state_->done) {
    // A pending send is only released: UCX finishes (or fails) it on its own.
    cancel();
    // Free what the cancels did not finish: once freed, UCX never calls back, so state_ may go.
    for (size_t i = 0; i < state_->started; ++i) {
      Part& part = state_->part(i);
      if (part.request != nullptr) ucp_request_free(std::exchange(part.request, nullptr));
    }
    state_->stop_holding(false);
  }
  state_.reset();
}

}  // namespace gradsync::transport
