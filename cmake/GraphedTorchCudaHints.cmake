# Helps a CUDA build of torch find its CUDA pieces: the toolkit root from the nvcc on the PATH,
# and libnvrtc from the CUDA wheels that pip installed beside torch when the toolkit lacks it.
if(NOT CUDA_TOOLKIT_ROOT_DIR)
  # The first candidate that holds the runtime's headers: CUDA_HOME, CUDA_PATH, the folder above
  # the nvcc on the PATH (nvcc may be a wrapper elsewhere), then the conventional location.
  set(_graphed_cuda_candidates $ENV{CUDA_HOME} $ENV{CUDA_PATH})
  find_program(GRAPHED_NVCC nvcc)
  if(GRAPHED_NVCC)
    get_filename_component(_graphed_nvcc_real "${GRAPHED_NVCC}" REALPATH)
    get_filename_component(_graphed_bin "${_graphed_nvcc_real}" DIRECTORY)
    get_filename_component(_graphed_root "${_graphed_bin}" DIRECTORY)
    list(APPEND _graphed_cuda_candidates "${_graphed_root}")
  endif()
  list(APPEND _graphed_cuda_candidates /usr/local/cuda)
  foreach(_graphed_candidate IN LISTS _graphed_cuda_candidates)
    if(EXISTS "${_graphed_candidate}/include/cuda_runtime.h")
      set(CUDA_TOOLKIT_ROOT_DIR "${_graphed_candidate}" CACHE PATH "CUDA toolkit root")
      break()
    endif()
  endforeach()
endif()
if(CUDA_TOOLKIT_ROOT_DIR AND NOT CMAKE_CUDA_COMPILER AND EXISTS "${CUDA_TOOLKIT_ROOT_DIR}/bin/nvcc")
  set(CMAKE_CUDA_COMPILER "${CUDA_TOOLKIT_ROOT_DIR}/bin/nvcc")
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
