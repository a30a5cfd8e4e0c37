# ddprun: the launcher. Plain C++17 and POSIX, no Torch, so it builds in
# seconds. Its code is an OBJECT library so that tests/launch can link the
# parser and the line splitter directly.
add_library(ddprun_objects OBJECT
  src/launch/options.cpp
  src/launch/output.cpp
  src/launch/supervisor.cpp
  src/launch/child_process.cpp
  src/launch/teardown_dumps.cpp
  src/flight_recorder/analyzer.cpp
  src/flight_recorder/dump_directory.cpp
  src/flight_recorder/launcher_account.cpp
  src/internal/json.cpp
  src/flight_recorder/pytorch_dump.cpp
  src/timeline/trace_merge.cpp
  src/timeline/trace_svg.cpp
  src/internal/text_files.cpp)
ddp_unity(ddprun_objects)
target_include_directories(ddprun_objects PUBLIC ${PROJECT_SOURCE_DIR}/src)
target_compile_options(ddprun_objects PRIVATE -Wall -Wextra)

add_executable(ddprun src/launch/ddprun.cpp $<TARGET_OBJECTS:ddprun_objects>)
target_include_directories(ddprun PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_compile_options(ddprun PRIVATE -Wall -Wextra)
