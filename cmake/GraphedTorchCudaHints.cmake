# Helps a CUDA build of torch find its CUDA pieces: the toolkit root (CUDA_HOME, the nvcc on the
# PATH, /usr/local/cuda, or the nvcc wheels from PyPI beside torch), the shape torch's CMake config
# expects of the PyPI wheels' toolkit, and libnvrtc from the CUDA wheels that pip installed beside
# torch when the toolkit lacks it.
# Input: GRAPHED_TORCH_CUDA (torch.version.cuda), GRAPHED_TORCH_PREFIX (torch's share/cmake).
if(NOT CUDA_TOOLKIT_ROOT_DIR)
  # The candidates, in order: CUDA_HOME, CUDA_PATH, the folder above the nvcc on the PATH (nvcc may
  # be a wrapper elsewhere), the conventional location, then the toolkit that the PyPI wheels
  # (nvidia-cuda-nvcc and its companions: install/nvcc_wheels.py) unpack beside torch,
  # site-packages/nvidia/cu<major>. The first whose nvcc is of torch's exact CUDA "major.minor"
  # wins. Where none is, the first of torch's major whose nvcc and headers are of one release (an
  # installed toolkit: torch's CMake config takes it, and the build warns and names the exact
  # one); never one whose nvcc and headers differ (a 13.0 nvcc from PyPI beside the 13.2 headers
  # of torch's own wheels stops torch's CMake config: "FindCUDA says CUDA version is 13.0 ... but
  # the CUDA headers say the version is 13.2"). Where neither is, no toolkit is taken and the CUDA
  # backend is left out; GRAPHED_CUDA_MISMATCHED names the nvcc passed over, for the message.
  set(_graphed_cuda_candidates $ENV{CUDA_HOME} $ENV{CUDA_PATH})
  find_program(GRAPHED_NVCC nvcc)
  if(GRAPHED_NVCC)
    get_filename_component(_graphed_nvcc_real "${GRAPHED_NVCC}" REALPATH)
    get_filename_component(_graphed_bin "${_graphed_nvcc_real}" DIRECTORY)
    get_filename_component(_graphed_root "${_graphed_bin}" DIRECTORY)
    list(APPEND _graphed_cuda_candidates "${_graphed_root}")
  endif()
  list(APPEND _graphed_cuda_candidates /usr/local/cuda)
  string(REGEX MATCH "^[0-9]+" _graphed_want_major "${GRAPHED_TORCH_CUDA}")
  string(REGEX MATCH "^[0-9]+\\.[0-9]+" _graphed_want_release "${GRAPHED_TORCH_CUDA}")
  set(_graphed_pypi_root "")
  if(_graphed_want_major)
    get_filename_component(_graphed_pypi_root
      "${GRAPHED_TORCH_PREFIX}/../../../nvidia/cu${_graphed_want_major}" ABSOLUTE)
    # torch's own wheels put the runtime's headers there too: only with nvcc is it a toolkit.
    if(EXISTS "${_graphed_pypi_root}/bin/nvcc")
      list(APPEND _graphed_cuda_candidates "${_graphed_pypi_root}")
    endif()
  endif()
  set(_graphed_cuda_match "")
  set(_graphed_cuda_same_major "")
  set(GRAPHED_CUDA_MISMATCHED "")
  set(GRAPHED_CUDA_NOT_EXACT "")
  list(REMOVE_DUPLICATES _graphed_cuda_candidates)
  foreach(_graphed_candidate IN LISTS _graphed_cuda_candidates)
    if(NOT _graphed_want_release OR NOT EXISTS "${_graphed_candidate}/include/cuda_runtime_api.h"
        OR NOT EXISTS "${_graphed_candidate}/bin/nvcc")
      continue()
    endif()
    execute_process(COMMAND "${_graphed_candidate}/bin/nvcc" --version
      OUTPUT_VARIABLE _graphed_nvcc_version ERROR_QUIET)
    if(NOT _graphed_nvcc_version MATCHES "release ([0-9]+)\\.([0-9]+)")
      continue()
    endif()
    set(_graphed_nvcc_release "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
    set(_graphed_nvcc_major "${CMAKE_MATCH_1}")
    if(_graphed_nvcc_release STREQUAL _graphed_want_release)
      set(_graphed_cuda_match "${_graphed_candidate}")
      break()
    endif()
    # The release of the headers beside it (CUDART_VERSION 13020: 13.2).
    file(STRINGS "${_graphed_candidate}/include/cuda_runtime_api.h" _graphed_cudart
      REGEX "^#define CUDART_VERSION +[0-9]+")
    string(REGEX MATCH "[0-9]+$" _graphed_cudart "${_graphed_cudart}")
    set(_graphed_headers_release "")
    if(_graphed_cudart)
      math(EXPR _graphed_headers_major "${_graphed_cudart} / 1000")
      math(EXPR _graphed_headers_minor "(${_graphed_cudart} % 1000) / 10")
      set(_graphed_headers_release "${_graphed_headers_major}.${_graphed_headers_minor}")
    endif()
    if(NOT _graphed_cuda_same_major AND _graphed_nvcc_major STREQUAL _graphed_want_major
        AND _graphed_headers_release STREQUAL _graphed_nvcc_release)
      set(_graphed_cuda_same_major "${_graphed_candidate}")
      set(GRAPHED_CUDA_NOT_EXACT "${_graphed_nvcc_release}")
    endif()
    list(APPEND GRAPHED_CUDA_MISMATCHED
      "${_graphed_candidate}/bin/nvcc (CUDA ${_graphed_nvcc_release}, headers ${_graphed_headers_release})")
  endforeach()
  if(_graphed_cuda_match)
    set(GRAPHED_CUDA_NOT_EXACT "")
    set(CUDA_TOOLKIT_ROOT_DIR "${_graphed_cuda_match}" CACHE PATH "CUDA toolkit root")
  elseif(_graphed_cuda_same_major)
    set(CUDA_TOOLKIT_ROOT_DIR "${_graphed_cuda_same_major}" CACHE PATH "CUDA toolkit root")
  endif()
endif()
if(CUDA_TOOLKIT_ROOT_DIR AND NOT CMAKE_CUDA_COMPILER AND EXISTS "${CUDA_TOOLKIT_ROOT_DIR}/bin/nvcc")
  set(CMAKE_CUDA_COMPILER "${CUDA_TOOLKIT_ROOT_DIR}/bin/nvcc")
endif()
# The PyPI wheels' toolkit differs from an installed one in two ways that matter here: its
# libraries are in lib/ where nvcc's own link line looks in lib64/ (CMake's compiler check links a
# program), and it has no unversioned libcudart.so, which torch's CMake config asks for. So nvcc is
# told where lib/ is, and a link libcudart.so -> libcudart.so.<N> in the build tree stands in.
if(CUDA_TOOLKIT_ROOT_DIR AND NOT EXISTS "${CUDA_TOOLKIT_ROOT_DIR}/lib64"
    AND NOT EXISTS "${CUDA_TOOLKIT_ROOT_DIR}/lib/libcudart.so")
  file(GLOB _graphed_versioned_cudart "${CUDA_TOOLKIT_ROOT_DIR}/lib/libcudart.so.[0-9]*")
  if(_graphed_versioned_cudart)
    list(GET _graphed_versioned_cudart 0 _graphed_versioned_cudart)
    set(_graphed_cuda_links "${CMAKE_BINARY_DIR}/graphed-cuda-links")
    file(MAKE_DIRECTORY "${_graphed_cuda_links}")
    file(CREATE_LINK "${_graphed_versioned_cudart}" "${_graphed_cuda_links}/libcudart.so" SYMBOLIC)
    list(APPEND CMAKE_LIBRARY_PATH "${_graphed_cuda_links}")
    # Kept apart too: CMakeLists.txt empties CMAKE_CUDA_FLAGS of torch's -gencode list later and
    # puts this back. Quoted for a path with spaces.
    set(GRAPHED_CUDA_LINK_FLAGS "-L\"${CUDA_TOOLKIT_ROOT_DIR}/lib\"")
    string(APPEND CMAKE_CUDA_FLAGS " ${GRAPHED_CUDA_LINK_FLAGS}")
  endif()
endif()
if(NOT CUDA_nvrtc_LIBRARY)
  find_library(CUDA_nvrtc_LIBRARY nvrtc
    HINTS ${CUDA_TOOLKIT_ROOT_DIR}/lib64 ${CUDA_TOOLKIT_ROOT_DIR}/lib)
  if(NOT CUDA_nvrtc_LIBRARY)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c
        "import glob, os, torch; p = os.path.dirname(os.path.dirname(torch.__file__)); print(';'.join(sorted(glob.glob(p + '/nvidia/*/lib/libnvrtc.so*'))))"
      OUTPUT_VARIABLE _graphed_nvrtc OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(_graphed_nvrtc)
      list(GET _graphed_nvrtc 0 _graphed_nvrtc_first)
      set(CUDA_nvrtc_LIBRARY "${_graphed_nvrtc_first}" CACHE FILEPATH "libnvrtc" FORCE)
    endif()
  endif()
endif()
# torch's CUDA headers include the cuSPARSE, cuBLAS and cuSOLVER headers; a bare toolkit may lack
# them while the CUDA wheels beside torch carry them.
set(GRAPHED_CUDA_EXTRA_INCLUDES "")
if(CUDA_TOOLKIT_ROOT_DIR AND NOT EXISTS "${CUDA_TOOLKIT_ROOT_DIR}/include/cusparse.h")
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
      "import glob, os, torch; p = os.path.dirname(os.path.dirname(torch.__file__)); print(';'.join(sorted(os.path.dirname(h) for h in glob.glob(p + '/nvidia/*/include/cusparse.h'))))"
    OUTPUT_VARIABLE GRAPHED_CUDA_EXTRA_INCLUDES OUTPUT_STRIP_TRAILING_WHITESPACE)
endif()
