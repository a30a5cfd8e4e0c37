# Private helpers (checks, environment variables, logging, the text files
# ddp writes) and blas_in_use().
ddp_add_part(ddp_internal src/internal/internal.cpp src/internal/blas.cpp src/internal/text_files.cpp
  src/internal/json.cpp)
# nlohmann/json reads JSON (json.cpp, the one file that includes it): Debian's
# nlohmann-json3-dev, header-only, 3.10 or a later 3.x (the SAX interface
# json.cpp implements). ddprun compiles json.cpp too (src/launch/launch.cmake).
find_package(nlohmann_json 3.10 QUIET)
if(NOT nlohmann_json_FOUND)
  message(FATAL_ERROR "ddp: nlohmann/json 3.10 or later 3.x not found: apt-get install nlohmann-json3-dev "
    "(scripts/setup.sh installs it), or set nlohmann_json_DIR to its CMake package")
endif()
if(nlohmann_json_VERSION VERSION_GREATER_EQUAL 4)
  message(FATAL_ERROR "ddp: nlohmann/json ${nlohmann_json_VERSION} found; json.cpp is written for 3.x")
endif()
target_link_libraries(ddp_internal PRIVATE nlohmann_json::nlohmann_json)
