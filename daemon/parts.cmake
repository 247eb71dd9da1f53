# The daemon's parts, one static library per folder, each naming the parts beneath it. The
# layers, bottom up:
#
#   base       configuration, logging, small containers
#   device     the node's GPUs (through CUDA, or none)
#   memory     client memory mapped into the daemon
#   job        what a job is made of: clients' sessions, submissions, ready units, step meter, trace
#   qos        the shares between jobs: policy, weighted-fair order, the pacer of inter-node sends;
#              and priorities between one job's collectives
#   links      the inter-node links and who is where (rank map, per-peer tasks)
#   collectives/local      the collectives among one node's ranks
#   collectives/internode  the collectives among nodes
#   node       a job's inter-node part: formation, negotiation, running what was agreed
#   aggregator the aggregator role: summing other nodes' allreduces (docs/aggregators.md)
#   engine     the engine thread, its executor and reduce pool, and the jobs it runs
#   control    the client socket, admission and admin requests
#
# A part may include headers of the parts it names and of theirs, never of a part above it:
# cmake/check_daemon_layers.py checks every build, so a wrong include fails it.

set(gradsync_daemon_layers "")

# gradsync_daemon_part(<folder under daemon/> SOURCES ... [PARTS <folders>...] [LIBS <targets>...])
function(gradsync_daemon_part folder)
  cmake_parse_arguments(PART "" "" "SOURCES;PARTS;LIBS" ${ARGN})
  string(REPLACE "/" "_" name "gradsync_daemon_${folder}")
  add_library(${name} STATIC ${PART_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  set(part_targets "")
  foreach(part IN LISTS PART_PARTS)
    string(REPLACE "/" "_" dependency "gradsync_daemon_${part}")
    list(APPEND part_targets ${dependency})
  endforeach()
  target_link_libraries(${name} PUBLIC ${part_targets} ${PART_LIBS})
  list(JOIN PART_PARTS " " parts)
  set(gradsync_daemon_layers "${gradsync_daemon_layers}${folder}: ${parts}\n" PARENT_SCOPE)
endfunction()

gradsync_daemon_part(base
  SOURCES daemon/base/config.cpp daemon/base/log.cpp
  LIBS gradsync_cost_model gradsync_ipc tomlplusplus::tomlplusplus spdlog::spdlog fmt::fmt
       nlohmann_json::nlohmann_json PkgConfig::SYSTEMD Threads::Threads)

if(gradsync_with_cuda)
  gradsync_daemon_part(device
    SOURCES daemon/device/uuid.cpp daemon/device/cuda_devices.cpp daemon/device/cuda_streams.cpp
            daemon/device/cuda_vmm.cpp
    LIBS gradsync_ipc gradsync_cuda_kernels CUDA::cudart_static)
else()
  gradsync_daemon_part(device
    SOURCES daemon/device/uuid.cpp daemon/device/no_cuda_devices.cpp
    LIBS gradsync_ipc)
endif()

gradsync_daemon_part(memory
  SOURCES daemon/memory/host_mapper.cpp
  LIBS gradsync_ipc)

gradsync_daemon_part(job
  SOURCES daemon/job/session.cpp daemon/job/submission.cpp daemon/job/step_meter.cpp
          daemon/job/autotune.cpp
          daemon/job/trace.cpp
  PARTS base device memory
  LIBS gradsync_ipc gradsync_metrics)

gradsync_daemon_part(qos
  SOURCES daemon/qos/policy.cpp daemon/qos/fair_share.cpp daemon/qos/wire_pacer.cpp
  PARTS base)

capnp_generate_cpp(AGGREGATION_SRCS AGGREGATION_HDRS daemon/links/aggregation.capnp)
gradsync_daemon_part(links
  SOURCES daemon/links/node_task.cpp daemon/links/rank_map.cpp daemon/links/links.cpp
          ${AGGREGATION_SRCS}
  PARTS base qos
  LIBS gradsync_ipc gradsync_transport CapnProto::capnp)

gradsync_daemon_part(collectives/local
  SOURCES daemon/collectives/local/local_allreduce.cpp daemon/collectives/local/local_broadcast.cpp
          daemon/collectives/local/local_allgather.cpp
          daemon/collectives/local/local_reduce_scatter.cpp
          daemon/collectives/local/local_alltoall.cpp daemon/collectives/local/device_work.cpp
  PARTS job
  LIBS gradsync_kernels)

gradsync_daemon_part(collectives/internode
  SOURCES daemon/collectives/internode/allreduce_operand.cpp
          daemon/collectives/internode/residuals.cpp
          daemon/collectives/internode/device_staging.cpp
          daemon/collectives/internode/node_common.cpp
          daemon/collectives/internode/node_ring_allreduce.cpp
          daemon/collectives/internode/node_halving_doubling_allreduce.cpp
          daemon/collectives/internode/node_direct_allreduce.cpp
          daemon/collectives/internode/node_direct_broadcast.cpp
          daemon/collectives/internode/node_chain_broadcast.cpp
          daemon/collectives/internode/node_allgather.cpp
          daemon/collectives/internode/node_topk_allreduce.cpp
          daemon/collectives/internode/node_reduce_scatter.cpp
          daemon/collectives/internode/node_alltoall.cpp
          daemon/collectives/internode/node_aggregate_allreduce.cpp
  PARTS collectives/local links
  LIBS gradsync_cost_model gradsync_kernels)

capnp_generate_cpp(INTERNODE_SRCS INTERNODE_HDRS daemon/node/internode.capnp)
gradsync_daemon_part(node
  SOURCES daemon/node/signature.cpp daemon/node/response_cache.cpp daemon/node/negotiator.cpp
          daemon/node/negotiator_routes.cpp daemon/node/link_probe.cpp daemon/node/node_job.cpp
          daemon/node/node_job_run.cpp ${INTERNODE_SRCS}
  PARTS collectives/internode
  LIBS gradsync_metrics CapnProto::capnp)

gradsync_daemon_part(aggregator
  SOURCES daemon/aggregator/aggregator.cpp daemon/aggregator/aggregator_job.cpp
  PARTS links
  LIBS gradsync_kernels gradsync_metrics)

gradsync_daemon_part(engine
  SOURCES daemon/engine/job.cpp daemon/engine/reduce_pool.cpp daemon/engine/executor.cpp
          daemon/engine/engine.cpp daemon/engine/engine_inspect.cpp daemon/engine/engine_peers.cpp
          daemon/engine/engine_device.cpp daemon/engine/engine_local.cpp
  PARTS node aggregator)

gradsync_daemon_part(control
  SOURCES daemon/control/control.cpp daemon/control/control_admin.cpp
          daemon/control/admission.cpp daemon/control/admin.cpp daemon/control/unix_listener.cpp
  PARTS engine)

# The whole daemon but its main(), for gradsyncd and for the tests that drive its parts.
add_library(gradsync_daemon INTERFACE)
target_link_libraries(gradsync_daemon INTERFACE gradsync_daemon_control)

file(WRITE ${PROJECT_BINARY_DIR}/daemon_layers.txt "${gradsync_daemon_layers}")
add_custom_target(gradsync_daemon_layers ALL
  COMMAND Python3::Interpreter ${PROJECT_SOURCE_DIR}/cmake/check_daemon_layers.py
          ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}/daemon_layers.txt
  COMMENT "Checking that the daemon's parts include only the parts beneath them"
  VERBATIM)
