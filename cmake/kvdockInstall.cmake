# `cmake --install`: the daemon and the CLI (bin), libkvdock shared and
# static and the kernel library (lib), the public headers (include/kvdock),
# a pkg-config file and a CMake package (find_package(kvdock) gives
# kvdock::kvdock, kvdock::kvdock_static, kvdock::kernels,
# kvdock::kernels_static), the systemd units and the example config.
# Everything installed is relocatable: the .pc and the package config find
# the prefix from where they lie, so DESTDIR and --prefix both work.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(KVD_SYSTEMD_UNIT_DIR "lib/systemd/system" CACHE STRING
  "Where `cmake --install` puts kvdockd.service and kvdockd.socket (relative: under the prefix); empty: only under share/kvdock/systemd")
set(KVD_PKG_DIR ${CMAKE_BINARY_DIR}/pkg)

# libkvdock.a: the client objects and the protocol runtime they use (the
# generated messages, the framing and the polling rule, which the in-tree
# kvdock_client gets from the internal kvdock_proto archive) in one archive
# a consumer can link.
set(KVD_PROTO_GEN_C ${CMAKE_BINARY_DIR}/proto/gen/kvdock.pb-c.c)
set_source_files_properties(${KVD_PROTO_GEN_C} PROPERTIES GENERATED TRUE COMPILE_OPTIONS "-w")
add_library(kvdock_client_pkg STATIC $<TARGET_OBJECTS:kvdock_client_obj>
  $<TARGET_OBJECTS:kvdock_vocab> ${KVD_PROTO_RUNTIME_SOURCES} ${KVD_PROTO_GEN_C})
add_dependencies(kvdock_client_pkg kvdock_proto)
target_link_libraries(kvdock_client_pkg PRIVATE kvdock_proto)
set_target_properties(kvdock_client_pkg PROPERTIES OUTPUT_NAME kvdock
  ARCHIVE_OUTPUT_DIRECTORY ${KVD_PKG_DIR})

install(TARGETS kvdockd kvdock RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS kvdock_client_shared kvdock_kernels_shared
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS kvdock_client_pkg kvdock_kernels ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
# client.h and kernels.h include the shared vocabulary, status.h and
# types.h (proto/include).
install(FILES
  ${CMAKE_SOURCE_DIR}/client/include/kvdock/client.h
  ${CMAKE_SOURCE_DIR}/proto/include/kvdock/status.h
  ${CMAKE_SOURCE_DIR}/proto/include/kvdock/types.h
  ${CMAKE_SOURCE_DIR}/kernels/include/kvdock/kernels.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvdock)

# Private dependencies of the static archives, for the .pc and the package.
# The CUDA runtime's folder is the .pc's variable cudalibdir (this build's
# toolkit by default), so that a machine whose toolkit lies elsewhere links
# with --define-variable=cudalibdir=DIR; a CPU build's .pc has none.
set(KVD_PC_LIBS_PRIVATE "-lprotobuf-c -pthread")
set(KVD_PC_KERNELS_LIBS_PRIVATE "-lm")
set(KVD_PC_CUDA_VARS "")
if(KVD_HAVE_CUDA)
  set(KVD_PC_CUDA_VARS "cudalibdir=${CUDAToolkit_LIBRARY_DIR}\n")
  set(KVD_PC_CUDA "-L\${cudalibdir} -lcudart_static -ldl -lrt -pthread")
  string(APPEND KVD_PC_LIBS_PRIVATE " ${KVD_PC_CUDA}")
  string(APPEND KVD_PC_KERNELS_LIBS_PRIVATE " ${KVD_PC_CUDA}")
  set(KVD_PKG_WITH_CUDA ON)
else()
  set(KVD_PKG_WITH_CUDA OFF)
endif()
file(RELATIVE_PATH KVD_PC_PREFIX_REL ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" KVD_PC_PREFIX_REL "${KVD_PC_PREFIX_REL}")
configure_file(${CMAKE_SOURCE_DIR}/client/kvdock.pc.in ${KVD_PKG_DIR}/kvdock.pc @ONLY)
configure_file(${CMAKE_SOURCE_DIR}/kernels/kvdock-kernels.pc.in ${KVD_PKG_DIR}/kvdock-kernels.pc @ONLY)
install(FILES ${KVD_PKG_DIR}/kvdock.pc ${KVD_PKG_DIR}/kvdock-kernels.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

set(KVD_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvdock)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/kvdockConfig.cmake.in
  ${KVD_PKG_DIR}/kvdockConfig.cmake INSTALL_DESTINATION ${KVD_CMAKE_DIR}
  PATH_VARS CMAKE_INSTALL_LIBDIR CMAKE_INSTALL_INCLUDEDIR CMAKE_INSTALL_BINDIR)
write_basic_package_version_file(${KVD_PKG_DIR}/kvdockConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${KVD_PKG_DIR}/kvdockConfig.cmake ${KVD_PKG_DIR}/kvdockConfigVersion.cmake
  DESTINATION ${KVD_CMAKE_DIR})

# The systemd units, ExecStart naming the kvdockd of the prefix they are
# installed to: written at install time, since `cmake --install --prefix`
# may name another prefix than the build was configured with; the
# example config.
if(IS_ABSOLUTE "${CMAKE_INSTALL_BINDIR}")
  set(kvd_bin_expr "${CMAKE_INSTALL_BINDIR}")
else()
  set(kvd_bin_expr "\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}")
endif()
install(CODE "
  set(KVD_INSTALLED_KVDOCKD \"${kvd_bin_expr}/kvdockd\")
  configure_file(\"${CMAKE_SOURCE_DIR}/deploy/kvdockd.service\"
    \"${KVD_PKG_DIR}/kvdockd.service\" @ONLY)")
set(KVD_UNITS ${KVD_PKG_DIR}/kvdockd.service ${CMAKE_SOURCE_DIR}/deploy/kvdockd.socket)
install(FILES ${KVD_UNITS} DESTINATION ${CMAKE_INSTALL_DATADIR}/kvdock/systemd)
if(KVD_SYSTEMD_UNIT_DIR)
  install(FILES ${KVD_UNITS} DESTINATION ${KVD_SYSTEMD_UNIT_DIR})
endif()
install(FILES ${CMAKE_SOURCE_DIR}/deploy/kvdockd.example.conf
  DESTINATION ${CMAKE_INSTALL_DATADIR}/kvdock)
