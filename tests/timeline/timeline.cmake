# tests: timeline. The recorder's rules (steps kept, lanes, bounds, the
# file) and ddprun's merge and picture, in one process; and a real job's
# trace, examples/mnist on 2 ranks under `ddprun --trace`, checked against
# the Trace Event Format and DDP's insight (run_trace_test.sh).
ddp_add_gtest(timeline_test
  SOURCES timeline/timeline_test.cpp $<TARGET_OBJECTS:ddprun_objects>
  LIBS ddp
  LABELS unit TIMEOUT 60)
if(DDP_BUILD_EXAMPLES)
  ddp_add_output_test(timeline_mnist_trace EXIT 0 REGEX "^check_trace: OK$"
    TIMEOUT 120 LABELS integration
    COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/run_trace_test.sh $<TARGET_FILE:ddprun> $<TARGET_FILE:mnist_train>
      ${DDP_TEST_PYTHON} ${CMAKE_CURRENT_BINARY_DIR}/timeline_work)
endif()
