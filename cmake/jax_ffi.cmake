# XLA FFI handlers for waveboost.jax (src/python/jax_ffi.cpp), compiled into _waveboost.
#
# They need the XLA FFI headers that jaxlib ships (jax.ffi.include_dir()). The directory comes
# from WAVEBOOST_XLA_FFI_INCLUDE_DIR when given, else from the Python that runs the build; a build
# that finds neither (pip's isolated build environment has no jaxlib) skips the handlers, and
# waveboost.jax then says so while plain waveboost.attention keeps taking JAX arrays eagerly.
# Included from CMakeLists.txt after the _waveboost target exists.

option(WAVEBOOST_ENABLE_JAX_FFI "Build the XLA FFI handlers for JAX when jaxlib's FFI headers are found" ON)
set(WAVEBOOST_XLA_FFI_INCLUDE_DIR "" CACHE PATH
    "Directory holding xla/ffi/api/ffi.h (jax.ffi.include_dir()); empty = ask the Python running the build")

if(WAVEBOOST_ENABLE_JAX_FFI)
  set(_wb_ffi_include "${WAVEBOOST_XLA_FFI_INCLUDE_DIR}")
  if(NOT _wb_ffi_include)
    execute_process(
      COMMAND "${Python_EXECUTABLE}" -c "import jax.ffi; print(jax.ffi.include_dir())"
      RESULT_VARIABLE _wb_ffi_result
      OUTPUT_VARIABLE _wb_ffi_include
      ERROR_QUIET
      OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT _wb_ffi_result EQUAL 0)
      set(_wb_ffi_include "")
    endif()
  endif()
  if(_wb_ffi_include AND EXISTS "${_wb_ffi_include}/xla/ffi/api/ffi.h")
    set(_wb_ffi_source "${CMAKE_CURRENT_SOURCE_DIR}/src/python/jax_ffi.cpp")
    target_sources(_waveboost PRIVATE "${_wb_ffi_source}")
    # SYSTEM: jaxlib's headers warn under GCC (-Wreturn-type) and are not ours to fix.
    target_include_directories(_waveboost SYSTEM PRIVATE "${_wb_ffi_include}")
    # The CUDA handler takes XLA's cudaStream_t; cuda_runtime.h comes with CUDA::cudart_static.
    if(WAVEBOOST_WITH_CUDA)
      set_source_files_properties("${_wb_ffi_source}" PROPERTIES COMPILE_DEFINITIONS WAVEBOOST_WITH_CUDA=1)
    endif()
    message(STATUS "waveboost: XLA FFI handlers for JAX: on (headers from ${_wb_ffi_include})")
  else()
    message(STATUS "waveboost: XLA FFI handlers for JAX: off (jaxlib's FFI headers not found by "
                   "${Python_EXECUTABLE}; build with --no-build-isolation in an environment with jax, or set "
                   "WAVEBOOST_XLA_FFI_INCLUDE_DIR). waveboost.attention still takes JAX arrays eagerly.")
  endif()
else()
  message(STATUS "waveboost: XLA FFI handlers for JAX: off (WAVEBOOST_ENABLE_JAX_FFI=OFF)")
endif()
