# tests: the plan (include/ddp/plan.h, `ddprun --plan`). The report's
# figures in one process with the fake backend (memory counted, DDP's steps
# and their bytes, the file); a plan's peak memory against real runs of
# examples/gpt on 2 and 3 ranks as DDP, ZeRO and FSDP (within 10%; FSDP
# planned with DDP_FAKE_SHM=1 within 1%); and
# 303M parameters as rank 0 of 1024 under FSDP, in one process, without
# ever holding the model, with the bytes a step of full sharding sends.
ddp_add_gtest(plan_test SOURCES plan/plan_test.cpp LIBS ddp_testing LABELS unit TIMEOUT 60)
# The H100 predictions' arithmetic (bench/scaling/predict_gpus.py), each
# term against its formula, and torchtitan's published figure between the
# model's bounds.
ddp_add_output_test(predict_gpus_test EXIT 0 REGEX "^predict_gpus_test: 9 of 9 checks passed$"
  TIMEOUT 30 LABELS unit
  COMMAND ${DDP_TEST_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/predict_gpus_test.py ${PROJECT_SOURCE_DIR}/bench/scaling)
# The simulated clusters' cost model (bench/scaling/cost_model.py): Gloo's
# algorithms over host links with the two bandwidths, and a step's network
# and CPU times combined.
ddp_add_output_test(cost_model_test EXIT 0 REGEX "^cost_model_test: 12 of 12 checks passed$"
  TIMEOUT 30 LABELS unit
  COMMAND ${DDP_TEST_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/cost_model_test.py ${PROJECT_SOURCE_DIR}/bench/scaling)
if(DDP_BUILD_EXAMPLES)
  ddp_add_output_test(plan_memory_gpt EXIT 0 REGEX "^check_plan_memory: OK$"
    TIMEOUT 240 LABELS integration
    COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/run_plan_test.sh memory $<TARGET_FILE:ddprun> $<TARGET_FILE:gpt_train>
      ${DDP_TEST_PYTHON} ${CMAKE_CURRENT_BINARY_DIR}/plan_work)
  ddp_add_output_test(plan_fsdp_1024 EXIT 0 REGEX "^check_plan_large_world: OK$"
    TIMEOUT 180 LABELS integration
    COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/run_plan_test.sh large-world $<TARGET_FILE:ddprun>
      $<TARGET_FILE:gpt_train> ${DDP_TEST_PYTHON} ${CMAKE_CURRENT_BINARY_DIR}/plan_large_work)
endif()
