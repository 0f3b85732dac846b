# Builds against a CUDA build of torch on a machine with no CUDA toolkit, or without the CUDA
# backend (GRAPHED_WITH_CUDA=OFF). torch's own CMake config
# (find_package(Torch)) then stops with "Your installed Caffe2 version uses CUDA but I cannot find
# the CUDA libraries", though graphed without its CUDA backend needs nothing of CUDA: it runs eager
# there, as the README promises. So this file finds what the plugin links by hand: torch's headers,
# libtorch_cpu and libc10, and the definitions torch's config would give its includers (the C++ ABI,
# the distributed headers' switches). It sets what the rest of CMakeLists.txt reads of
# find_package(Torch): TORCH_INSTALL_PREFIX and TORCH_LIBRARIES, and no torch_cuda target.
# Input: GRAPHED_TORCH_PREFIX (torch's share/cmake), Python3_EXECUTABLE.
get_filename_component(TORCH_INSTALL_PREFIX "${GRAPHED_TORCH_PREFIX}/../.." ABSOLUTE)
execute_process(
  COMMAND ${Python3_EXECUTABLE} -c "import torch; print(int(torch.compiled_with_cxx11_abi()))"
  OUTPUT_VARIABLE _graphed_cxx11_abi OUTPUT_STRIP_TRAILING_WHITESPACE)
foreach(_graphed_torch_lib torch_cpu c10)
  find_library(GRAPHED_LIB_${_graphed_torch_lib} ${_graphed_torch_lib}
    PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH REQUIRED)
endforeach()
add_library(graphed_torch_libraries INTERFACE)
target_include_directories(graphed_torch_libraries SYSTEM INTERFACE
  "${TORCH_INSTALL_PREFIX}/include" "${TORCH_INSTALL_PREFIX}/include/torch/csrc/api/include")
target_compile_definitions(graphed_torch_libraries INTERFACE
  _GLIBCXX_USE_CXX11_ABI=${_graphed_cxx11_abi} USE_DISTRIBUTED USE_C10D_GLOO)
target_link_libraries(graphed_torch_libraries INTERFACE
  ${GRAPHED_LIB_torch_cpu} ${GRAPHED_LIB_c10})
set(TORCH_LIBRARIES graphed_torch_libraries)
message(STATUS "graphed: built against torch's libraries without its CMake config (no CUDA "
  "toolkit, or GRAPHED_WITH_CUDA=OFF; no CUDA backend)")
