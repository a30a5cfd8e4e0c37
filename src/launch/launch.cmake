# ddprun: the launcher. Plain C++17 and POSIX, no Torch, so it builds in
# seconds. Its code is an OBJECT library so that tests/launch can link the
# parser and the line splitter directly. Its offline readers, which never
# run inside a training process, are in src/launch/readers/: the flight
# recorder's analyzer and its PyTorch-dump reader, the launcher's account
# of a failure, and the timeline's merge and picture. From the runtime it
# takes only what has no Torch in it: the dump directory's naming, the JSON
# reader and the text-file writer.
add_library(ddprun_objects OBJECT
  src/launch/options.cpp
  src/launch/output.cpp
  src/launch/supervisor.cpp
  src/launch/child_process.cpp
  src/launch/teardown_dumps.cpp
  src/launch/plan.cpp
  src/launch/readers/analyzer.cpp
  src/launch/readers/pytorch_dump.cpp
  src/launch/readers/launcher_account.cpp
  src/launch/readers/trace_merge.cpp
  src/launch/readers/trace_svg.cpp
  src/flight_recorder/dump_directory.cpp
  src/internal/json.cpp
  src/internal/text_files.cpp)
ddp_unity(ddprun_objects)
target_include_directories(ddprun_objects PUBLIC ${PROJECT_SOURCE_DIR}/src)
target_compile_options(ddprun_objects PRIVATE -Wall -Wextra)
target_link_libraries(ddprun_objects PRIVATE nlohmann_json::nlohmann_json) # json.cpp

add_executable(ddprun src/launch/ddprun.cpp $<TARGET_OBJECTS:ddprun_objects>)
target_include_directories(ddprun PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_compile_options(ddprun PRIVATE -Wall -Wextra)
