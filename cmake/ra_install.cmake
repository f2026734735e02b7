# `cmake --install`: headers under include/ringattn (the entry point is <ringattn/ringattn.h>), the
# static libraries, the CLI, a CMake package (find_package(ringattn) -> ringattn::ringattn) and a
# pkg-config file.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# One target for users: everything below the CLI.
add_library(ra_library INTERFACE)
target_link_libraries(ra_library INTERFACE ra_attention)
set_target_properties(ra_library PROPERTIES EXPORT_NAME ringattn)
add_library(ringattn::ringattn ALIAS ra_library)

install(TARGETS ra_runtime ra_collectives ra_mesh ra_attention ra_library EXPORT ringattnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS ringattn RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
foreach(dir runtime collectives mesh attention)
  install(DIRECTORY ${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ringattn/${dir}
          FILES_MATCHING PATTERN "*.h" PATTERN "cuda/*.cuh" EXCLUDE)
endforeach()
install(FILES include/ringattn/ringattn.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ringattn)
install(FILES launch/run_local.sh launch/hostfile.example DESTINATION ${CMAKE_INSTALL_DATADIR}/ringattn)

set(RA_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ringattn)
install(EXPORT ringattnTargets NAMESPACE ringattn:: DESTINATION ${RA_CMAKE_DIR})
configure_package_config_file(cmake/ringattnConfig.cmake.in ${CMAKE_BINARY_DIR}/ringattnConfig.cmake
                              INSTALL_DESTINATION ${RA_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/ringattnConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/ringattnConfig.cmake ${CMAKE_BINARY_DIR}/ringattnConfigVersion.cmake
        DESTINATION ${RA_CMAKE_DIR})

# pkg-config: our libraries in link order, then what they need (MPI, zlib, OpenMP, CUDA when built; HDF5 is
# the CLI's only).
set(RA_PC_LIBS "-lra_attention -lra_mesh -lra_collectives -lra_runtime")
set(RA_PC_PRIVATE "${MPI_C_LIBRARIES};-lz;-fopenmp;-lpthread")
if(RA_HAVE_CUDA)
  if(RA_CUDNN_LIBRARY AND EXISTS "${RA_CUDNN_FRONTEND_DIR}/cudnn_frontend.h")
    list(APPEND RA_PC_PRIVATE ${RA_CUDNN_LIBRARY} $<TARGET_FILE:CUDA::nvrtc>)
  endif()
  list(APPEND RA_PC_PRIVATE ${RA_NCCL_LIBRARY} $<TARGET_FILE:CUDA::cublas> $<TARGET_FILE:CUDA::cudart_static> -ldl -lrt)
endif()
list(JOIN RA_PC_PRIVATE " " RA_PC_PRIVATE)
set(RA_PC_CFLAGS "-std=c++20 -DRA_HAVE_CUDA=$<IF:$<BOOL:${RA_HAVE_CUDA}>,1,0> -DOMPI_SKIP_MPICXX=1")
foreach(dir ${MPI_C_INCLUDE_DIRS})
  string(APPEND RA_PC_CFLAGS " -I${dir}")
endforeach()
if(RA_HAVE_CUDA)
  string(APPEND RA_PC_CFLAGS " -I${CUDAToolkit_INCLUDE_DIRS}")
endif()
# Relocatable: the prefix is found from the .pc file's own place (lib/pkgconfig -> ../..).
file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/ringattn.pc CONTENT "prefix=\${pcfiledir}/../..
libdir=\${prefix}/${CMAKE_INSTALL_LIBDIR}
includedir=\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}

Name: ringattn
Description: Distributed ring attention (MPI / NCCL) in C++20
Version: ${PROJECT_VERSION}
Cflags: -I\${includedir} -I\${includedir}/ringattn ${RA_PC_CFLAGS}
Libs: -L\${libdir} ${RA_PC_LIBS} ${RA_PC_PRIVATE}
")
install(FILES ${CMAKE_BINARY_DIR}/ringattn.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
