# Debian packages, one per install component (cpack -G DEB; scripts/package builds them from a
# build configured for /usr):
#   gradsyncd          the daemon, gradsyncctl, the unit, sysusers and tmpfiles entries, the
#                      configuration (a conffile), the Grafana dashboard and Prometheus job
#   libgradsync0       the client library
#   libgradsync-dev    its headers, CMake package and pkg-config file
#   python3-gradsync   the Python package and the torch.distributed backend
#   gradsync-tools     gradsync-bench, gradsync-model, gradsync-transport-bench,
#                      gradsync-netns-cluster
# Dependencies on other packages come from the shared libraries each links (dpkg-shlibdeps).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME gradsync)
set(CPACK_PACKAGE_VENDOR gradsync)
set(CPACK_PACKAGE_CONTACT "gradsync maintainers <maintainers@gradsync.invalid>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "gradient communication for data-parallel training")
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_COMPONENTS_ALL daemon library development python tools)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_BINARY_DIR})

set(CPACK_DEBIAN_DAEMON_PACKAGE_NAME gradsyncd)
set(CPACK_DEBIAN_DAEMON_PACKAGE_SECTION net)
set(CPACK_DEBIAN_DAEMON_PACKAGE_DEPENDS "systemd | adduser")
set(CPACK_COMPONENT_DAEMON_DESCRIPTION
  "gradsync's per-node daemon\n gradsyncd fuses the gradient collectives of the training processes on a node,\n agrees on their order with the other nodes and runs them over UCX.")
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_EXTRA
  ${PROJECT_SOURCE_DIR}/packaging/debian/gradsyncd/postinst
  ${PROJECT_SOURCE_DIR}/packaging/debian/gradsyncd/prerm
  ${PROJECT_SOURCE_DIR}/packaging/debian/gradsyncd/postrm
  ${PROJECT_SOURCE_DIR}/packaging/debian/gradsyncd/conffiles)
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(CPACK_DEBIAN_LIBRARY_PACKAGE_NAME libgradsync0)
set(CPACK_DEBIAN_LIBRARY_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_LIBRARY_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_COMPONENT_LIBRARY_DESCRIPTION
  "gradsync's client library\n The C ABI training processes link to hand gradsyncd their buffers and ask for\n collectives.")

set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_NAME libgradsync-dev)
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_SECTION libdevel)
set(CPACK_COMPONENT_DEVELOPMENT_DEPENDS library)
set(CPACK_COMPONENT_DEVELOPMENT_DESCRIPTION
  "gradsync's client library: headers, CMake package, pkg-config file")

set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-gradsync)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_COMPONENT_PYTHON_DEPENDS library)
set(gradsync_python_depends "python3")
if(GRADSYNC_TORCH_BUILT)
  string(APPEND gradsync_python_depends ", python3-torch")
endif()
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS ${gradsync_python_depends})
set(CPACK_DEBIAN_PYTHON_PACKAGE_CONTROL_EXTRA
  ${PROJECT_SOURCE_DIR}/packaging/debian/python3-gradsync/prerm)
set(CPACK_DEBIAN_PYTHON_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_COMPONENT_PYTHON_DESCRIPTION
  "gradsync for Python and PyTorch\n The gradsync package, its DDP hooks and torch.distributed's backend, gradsync.")

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME gradsync-tools)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION net)
set(CPACK_COMPONENT_TOOLS_DESCRIPTION
  "gradsync's benchmarks and cost model\n gradsync-bench, gradsync-model, gradsync-transport-bench and\n gradsync-netns-cluster.")

include(CPack)
