#include "transport/ucx.h"

namespace gradsync::transport {
namespace {

// The callbacks release the request themselves: a completed Operation holds no UCX resource
// and may outlive its worker.
void on_send(void* request, ucs_status_t status, void* user_data) {
  auto* state = static_cast<Operation::State*>(user_data);
  if (state->unfinished_sends != nullptr) --*state->unfinished_sends;
  state->status = status;
  state->done = true;
  ucp_request_free(request);
}

void on_receive(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                void* user_data) {
  auto* state = static_cast<Operation::State*>(user_data);
  state->status = status;
  if (status == UCS_OK && info != nullptr) {
    state->received = info->length;
    state->sender_tag = info->sender_tag;
  }
  state->done = true;
  ucp_request_free(request);
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
    request_ = std::exchange(other.request_, nullptr);
    receive_ = other.receive_;
    state_ = std::move(other.state_);
  }
  return *this;
}

Operation Operation::started(ucp_worker_h worker, ucs_status_ptr_t request,
                             std::unique_ptr<State> state, bool receive) {
  Operation operation;
  operation.worker_ = worker;
  operation.receive_ = receive;
  if (request == nullptr) {  // completed at once
    state->done = true;
  } else if (UCS_PTR_IS_ERR(request)) {
    state->done = true;
    state->status = UCS_PTR_STATUS(request);
  } else {
    operation.request_ = request;
  }
  operation.state_ = std::move(state);
  return operation;
}

void Operation::cancel() {
  if (request_ != nullptr && receive_ && !state_->done) ucp_request_cancel(worker_, request_);
}

void Operation::release() {
  if (request_ != nullptr && !state_->done) {
    // A pending send is only released: UCX finishes (or fails) it on its own.
    if (receive_) ucp_request_cancel(worker_, request_);
    // The cancel may have completed it on the spot, callback (and its free) included.
    // Otherwise free it now: once freed, UCX never calls back, so state_ may go.
    if (!state_->done) {
      if (state_->unfinished_sends != nullptr) --*state_->unfinished_sends;
      ucp_request_free(request_);
    }
  }
  request_ = nullptr;
  state_.reset();
}

ucp_request_param_t send_params(Operation::State* state) {
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  params.cb.send = on_send;
  params.user_data = state;
  return params;
}

ucp_request_param_t receive_params(Operation::State* state) {
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  params.cb.recv = on_receive;
  params.user_data = state;
  return params;
}

}  // namespace gradsync::transport
