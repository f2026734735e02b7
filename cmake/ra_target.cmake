# Common settings for ringattn targets: C++20 on host code, warnings, the repository root on the
# include path (headers are included as "runtime/tensor.h"), -std=c++20 for nvcc.
function(ra_configure_target target)
  target_compile_features(${target} PUBLIC cxx_std_20)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers>
    $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 --expt-relaxed-constexpr>)
  # Headers are included as "runtime/tensor.h" inside the tree and installed under include/ringattn;
  # the public entry point is <ringattn/ringattn.h>.
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}> $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:include/ringattn> $<INSTALL_INTERFACE:include>)
endfunction()
