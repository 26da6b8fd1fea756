# Finds the libraries colossal builds on and decides which optional engines are compiled in.
# Each optional engine (CUDA, NCCL, MPI) is AUTO by default: on where found, off with a note where not.
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(fmt REQUIRED)
# nlohmann-json (header only): the JSON headers of safetensors files and model configs.
find_package(nlohmann_json 3.2 REQUIRED)
# zlib: the data layer reads gzip-compressed dataset files (MNIST/Fashion-MNIST .gz).
find_package(ZLIB REQUIRED)
# toml++: config files (config/). Debian's package builds it as a shared library, with a CMake config.
find_package(tomlplusplus 3 REQUIRED)

# OpenBLAS: the CPU GEMM. Debian ships it with a pkg-config file and cblas.h under include/openblas
# or include/<triplet>/openblas-pthread; BLAS_LIBRARIES alone would not give us the header.
find_package(PkgConfig REQUIRED)
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)

if(COLOSSAL_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(COLOSSAL_BUILD_BENCH)
  find_package(benchmark QUIET)
  if(NOT benchmark_FOUND)
    message(STATUS "colossal: Google Benchmark not found, bench/ is skipped")
  endif()
endif()

function(colossal_optional_engine name found)
  if(COLOSSAL_${name} STREQUAL "ON" AND NOT ${found})
    message(FATAL_ERROR "COLOSSAL_${name}=ON but ${name} was not found")
  endif()
  if(${found} AND NOT COLOSSAL_${name} STREQUAL "OFF")
    set(COLOSSAL_WITH_${name} ON PARENT_SCOPE)
  else()
    set(COLOSSAL_WITH_${name} OFF PARENT_SCOPE)
  endif()
endfunction()

set(_cuda_found OFF)
if(NOT COLOSSAL_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(_cuda_found ON)
  endif()
endif()
colossal_optional_engine(CUDA _cuda_found)

set(_nccl_found OFF)
if(COLOSSAL_WITH_CUDA AND NOT COLOSSAL_NCCL STREQUAL "OFF")
  # NCCL_ROOT: a folder with include/ and lib/ (a Python environment's nvidia-nccl wheel, say).
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${NCCL_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS} /usr/include)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${NCCL_ROOT}/lib ${CUDAToolkit_LIBRARY_DIR}
               /usr/lib/x86_64-linux-gnu)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(_nccl_found ON)
  endif()
endif()
colossal_optional_engine(NCCL _nccl_found)

set(_mpi_found OFF)
if(NOT COLOSSAL_MPI STREQUAL "OFF")
  find_package(MPI QUIET COMPONENTS CXX)
  if(MPI_CXX_FOUND)
    set(_mpi_found ON)
  endif()
endif()
colossal_optional_engine(MPI _mpi_found)

message(STATUS "colossal: CUDA=${COLOSSAL_WITH_CUDA} NCCL=${COLOSSAL_WITH_NCCL} MPI=${COLOSSAL_WITH_MPI}")
