# tests: checkpoint
#
# Checkpoints that leave C++: torch.save-format state dicts, safetensors and
# torch.distributed.checkpoint directories, against PyTorch (1.13 from
# Debian, 2.11 in the compat configuration) in both directions, across
# world sizes and wrappers, and every bad input refused with its message.
ddp_add_nn_program(checkpoint_interop_main checkpoint/interop_main.cpp)
target_include_directories(checkpoint_interop_main PRIVATE ${PROJECT_SOURCE_DIR}/tests)

# In one process: the pickler, torch.save-format files, safetensors, module
# and optimizer state dicts (every optimizer), and the bad inputs of each.
ddp_add_gtest(checkpoint_formats_test SOURCES checkpoint/checkpoint_formats_test.cpp LIBS ddp
  LABELS unit TIMEOUT 120)

# DCP directories in one process: boxes, round trips, a second save, and
# each bad input (no checkpoint, damaged or newer metadata, a missing,
# truncated or damaged chunk file, keys, shapes, dtypes, optimizers).
ddp_add_gtest(dcp_test SOURCES checkpoint/dcp_test.cpp LIBS ddp LABELS unit TIMEOUT 120)

# Both directions with PyTorch (DDP_TEST_PYTHON's): interop_cases.sh says
# which cases run with which PyTorch.
add_test(NAME checkpoint_interop
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/interop_cases.sh $<TARGET_FILE:ddprun>
    $<TARGET_FILE:checkpoint_interop_main> ${DDP_TEST_PYTHON})
set_tests_properties(checkpoint_interop PROPERTIES TIMEOUT 600 LABELS integration)

# In C++ alone: resharding through FSDP, ZeRO and DDP at 3, 2, 4 and 2
# ranks against one uninterrupted run; saves killed at each commit point;
# a rank's file missing.
add_test(NAME dcp_cases
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/dcp_cases.sh $<TARGET_FILE:ddprun>
    $<TARGET_FILE:checkpoint_interop_main> ${DDP_TEST_PYTHON})
set_tests_properties(dcp_cases PROPERTIES TIMEOUT 300 LABELS integration)
