# System dependencies, all from Debian packages. Each failure names the package to install.
function(zo_require_package name debian_pkg)
  find_package(${name} ${ARGN} QUIET)
  if(NOT ${name}_FOUND)
    message(FATAL_ERROR "offload_train needs ${name}: install it with `apt-get install ${debian_pkg}` "
                        "(or run `bash .ci/install-deps`).")
  endif()
endfunction()

zo_require_package(TBB libtbb-dev)
zo_require_package(Eigen3 libeigen3-dev)
zo_require_package(nlohmann_json nlohmann-json3-dev)
zo_require_package(CLI11 libcli11-dev)
if(ZO_BUILD_TESTS)
  zo_require_package(GTest libgtest-dev)
endif()
if(ZO_BUILD_BENCH)
  zo_require_package(benchmark libbenchmark-dev)
endif()

# libnuma ships no CMake config: find the header and library directly.
find_path(NUMA_INCLUDE_DIR numa.h)
find_library(NUMA_LIBRARY numa)
if(NOT NUMA_INCLUDE_DIR OR NOT NUMA_LIBRARY)
  message(FATAL_ERROR "offload_train needs libnuma: install it with `apt-get install libnuma-dev` "
                      "(or run `bash .ci/install-deps`).")
endif()
add_library(zo_numa INTERFACE)
target_include_directories(zo_numa SYSTEM INTERFACE ${NUMA_INCLUDE_DIR})
target_link_libraries(zo_numa INTERFACE ${NUMA_LIBRARY})

# liburing (Debian's liburing-dev) for the optimizer-state files' io_uring queue; like libnuma,
# no CMake config.
find_path(URING_INCLUDE_DIR liburing.h)
find_library(URING_LIBRARY uring)
if(NOT URING_INCLUDE_DIR OR NOT URING_LIBRARY)
  message(FATAL_ERROR "offload_train needs liburing: install it with `apt-get install liburing-dev` "
                      "(or run `bash .ci/install-deps`).")
endif()
add_library(zo_uring INTERFACE)
target_include_directories(zo_uring SYSTEM INTERFACE ${URING_INCLUDE_DIR})
target_link_libraries(zo_uring INTERFACE ${URING_LIBRARY})
