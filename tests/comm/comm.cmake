# tests: comm
# init_process_group and the composite group; each backend's tests are in its
# own folder.
ddp_add_gtest(init_test SOURCES comm/init_test.cpp LIBS ddp_testing LABELS unit TIMEOUT 60)
# One group over several backends, routed by the device of the tensors.
ddp_add_gtest(process_group_composite_test SOURCES comm/process_group_composite_test.cpp
  LIBS ddp_testing LABELS unit TIMEOUT 60)
# The fingerprint checks' pure logic: the hash check's verdict, and how a
# difference is explained through the store (src/comm/fingerprint.h).
ddp_add_gtest(fingerprint_test SOURCES comm/fingerprint_test.cpp LIBS ddp_testing LABELS unit TIMEOUT 60)
# The message of the check that every rank built the same thing, which DDP,
# ZeRO and FSDP share (src/comm/objects/same_on_every_rank.h).
ddp_add_gtest(same_on_every_rank_test SOURCES comm/same_on_every_rank_test.cpp LIBS ddp_testing LABELS unit
  TIMEOUT 60)
# The arrival step of every rendezvous (src/comm/rendezvous_arrival.h):
# ranks as threads over a HashStore, released together, a missing rank and a
# world size that differs named.
ddp_add_gtest(rendezvous_arrival_test SOURCES comm/rendezvous_arrival_test.cpp LIBS ddp_testing
  LABELS unit TIMEOUT 60)
# The fake backend: mirror outputs, the bytes counted, its checks, meta
# tensors, DDP, ZeRO and FSDP as one rank of 4 to 1024 in one process, and
# DDP_BACKEND=fake (include/ddp/comm/process_group_fake.h).
ddp_add_gtest(process_group_fake_test SOURCES comm/process_group_fake_test.cpp LIBS ddp_testing LABELS unit
  TIMEOUT 60)

# The collective sweep's checks, one source that every backend's test runs
# (comm/collective_sweep.h).
add_library(ddp_collective_sweep STATIC comm/collective_sweep.cpp)
target_link_libraries(ddp_collective_sweep PUBLIC ddp torch GTest::gtest Threads::Threads)
target_include_directories(ddp_collective_sweep PUBLIC ${PROJECT_SOURCE_DIR}/tests)
ddp_use_test_pch(ddp_collective_sweep)

# Subgroups (ddp::new_group): collectives on {0,1},{2,3} and {0,2},{1,3},
# the non-member handle, bad and mismatched calls, and two DDP replica
# groups in one job, each against one process; on 4 ranks under ddprun, and
# alone. On MPI: tests/comm/mpi/mpi.cmake.
add_executable(subgroups_main comm/subgroups_main.cpp)
target_link_libraries(subgroups_main PRIVATE ddp torch GTest::gtest Threads::Threads) # gtest: the PCH's flags
target_include_directories(subgroups_main PRIVATE ${PROJECT_SOURCE_DIR}/tests)
ddp_use_test_pch(subgroups_main)
ddp_add_launched_test(subgroups_4_ranks NPROC 4 COMMAND subgroups_main CASES 10 TIMEOUT 180)
# The replica groups against PyTorch's DDP over torch.distributed.new_group.
# (The same cache entry as tests/nn/nn.cmake's, which is included later.)
set(DDP_TEST_PYTHON "/usr/bin/python3" CACHE FILEPATH
    "Python interpreter with torch, for the parity tests against PyTorch")
add_test(NAME subgroups_pytorch_parity
  COMMAND ${DDP_TEST_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/pytorch_subgroups.py
    --ddprun $<TARGET_FILE:ddprun> --ours $<TARGET_FILE:subgroups_main>
    --python ${DDP_TEST_PYTHON} --workdir ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(subgroups_pytorch_parity PROPERTIES TIMEOUT 240 LABELS integration)
ddp_add_alone_test(subgroups_alone COMMAND subgroups_main CASES 4 TIMEOUT 60)

include(comm/gloo/gloo.cmake)
include(comm/mpi/mpi.cmake)

# Object collectives and batch_isend_irecv as real processes: IValues and
# raw bytes (0 bytes to 64 MiB) with every form, damaged frames, rings
# posted in any order, subgroups, the errors; Gloo under ddprun, MPI under
# mpirun. (Uneven all-to-all is in the collective sweep.)
add_executable(objects_main comm/objects_main.cpp)
target_link_libraries(objects_main PRIVATE ddp torch GTest::gtest Threads::Threads) # gtest: the PCH's flags
target_include_directories(objects_main PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src)
ddp_use_test_pch(objects_main)
ddp_add_launched_test(objects_2_ranks NPROC 2 COMMAND objects_main CASES 11 TIMEOUT 120)
ddp_add_launched_test(objects_3_ranks NPROC 3 COMMAND objects_main CASES 11 TIMEOUT 120)
ddp_add_alone_test(objects_alone COMMAND objects_main CASES 6 TIMEOUT 60)
ddp_add_output_test(objects_pytorch_parity EXIT 0 REGEX "^objects_pytorch_parity: 5 of 5 checks passed$"
  TIMEOUT 240 LABELS integration
  COMMAND ${DDP_TEST_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/pytorch_objects_parity.py
    --ddprun $<TARGET_FILE:ddprun> --ours $<TARGET_FILE:objects_main> --python ${DDP_TEST_PYTHON})
if(DDP_HAVE_MPI)
  ddp_add_mpi_test(objects_mpi_2_ranks NP 2 COMMAND objects_main CASES 11 TIMEOUT 120)
  ddp_add_mpi_test(objects_mpi_3_ranks NP 3 COMMAND objects_main CASES 11 TIMEOUT 120)
endif()

# Start-up exit sweep: one rank stops at each point of init_process_group
# (Note [Start-up exit points]), of the first collective and of DDP's
# construction, on 2 and 3 ranks; every other rank must get a catchable
# error naming its rank in time, never std::terminate or a hang.
add_executable(init_exit_main comm/init_exit_main.cpp)
target_link_libraries(init_exit_main PRIVATE ddp torch GTest::gtest Threads::Threads) # gtest: the PCH's flags
ddp_use_test_pch(init_exit_main)
ddp_add_output_test(init_exit_sweep EXIT 0 REGEX "^init_exit_sweep: 28 of 28 cases passed$"
  TIMEOUT 300 LABELS integration
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/init_exit_sweep.sh $<TARGET_FILE:init_exit_main>
    ${DDP_TEST_PYTHON})
ddp_add_output_test(rendezvous_progress EXIT 0 REGEX "^rendezvous_progress: 4 of 4 checks passed$"
  TIMEOUT 120 LABELS integration
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/rendezvous_progress.sh $<TARGET_FILE:init_exit_main>
    ${DDP_TEST_PYTHON})

# The labels of ddp's own collectives (SyncBatchNorm, DDP's buffer
# broadcast, ZeRO's step, FSDP's gathers) in mismatch errors and flight
# recorder dumps: two ranks calling different library collectives.
add_executable(labels_main comm/labels_main.cpp)
target_link_libraries(labels_main PRIVATE ddp torch GTest::gtest Threads::Threads) # gtest: the PCH's flags
ddp_use_test_pch(labels_main)
add_test(NAME collective_labels
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/labels_cases.sh $<TARGET_FILE:ddprun> $<TARGET_FILE:labels_main>)
set_tests_properties(collective_labels PROPERTIES TIMEOUT 120 LABELS integration)
