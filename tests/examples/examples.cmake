# The examples, run as a user would run them (examples/*/README.md).
# Performance is never tested: only what the programs print and write.

# toy_model: PyTorch's DDP tutorial on 2 ranks (it exits 1 if the ranks'
# parameters differ after a step), and alone as a world of size 1.
# The launched test goes by exit status, which covers every check.
ddp_add_launched_test(toy_model_2_ranks NPROC 2 COMMAND toy_model TIMEOUT 60 LABELS examples)
ddp_add_output_test(toy_model_alone EXIT 0
  REGEX "checkpoint: parameters agree across 1 rank \\(max difference 0\\)" FORBID "DIFFER"
  TIMEOUT 30 LABELS integration COMMAND $<TARGET_FILE:toy_model>)

# mnist_train on 2 ranks: it learns the synthetic set; a run stopped after
# epoch 1 and resumed ends bit for bit where an uninterrupted run ends, and so
# does one whose rank 1 is killed mid-epoch under ddprun --max-restarts 1; it
# reads IDX files with --data; with --comm-hook powersgd its accuracy stays
# within 0.03 of the uncompressed run's, and so does local SGD's
# (--comm-hook localsgd, period 4) with fewer bytes; with --optimizer-sharding zero1 it
# ends bit for bit where the unsharded run ends, resumed or not, and from an
# unsharded checkpoint; with --fsdp it ends where DDP ends, resumed or not,
# and a sharded checkpoint resumes on another world size; its checkpoints
# in DCP, torch.save and safetensors formats resume bit for bit, and DCP at
# another world size (see run_mnist_train_test.sh).
foreach(mode accuracy resume restart powersgd localsgd zero1 fsdp formats idx)
  add_test(NAME mnist_train_${mode}
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/examples/run_mnist_train_test.sh
            $<TARGET_FILE:ddprun> $<TARGET_FILE:mnist_train>
            ${CMAKE_CURRENT_BINARY_DIR}/examples_work/mnist_train_${mode} ${mode})
  set_tests_properties(mnist_train_${mode} PROPERTIES TIMEOUT 120 LABELS "integration")
endforeach()

# What ddp says of the BLAS LibTorch computes with: the ToyModel's header
# names it, 1 thread per rank under ddprun, and with Debian's reference BLAS
# swapped in (LD_LIBRARY_PATH), exactly one warning with the fix, from rank 0
# (see run_blas_check_test.sh; it prints how many checks ran).
add_test(NAME blas_check
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/examples/run_blas_check_test.sh
          $<TARGET_FILE:ddprun> $<TARGET_FILE:toy_model>
          /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/blas)
set_tests_properties(blas_check PROPERTIES TIMEOUT 60 LABELS "integration")

# gpt_train against gpt.py (PyTorch) on the same weights and batches: the
# losses of 20 steps of DDP, ZeRO, FSDP and FSDP with activation
# checkpointing on 2 ranks (1e-4), and a DCP resume (run_gpt_train_test.sh).
add_test(NAME gpt_train_parity
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/examples/run_gpt_train_test.sh
          $<TARGET_FILE:ddprun> $<TARGET_FILE:gpt_train> ${PROJECT_SOURCE_DIR}/examples/gpt/gpt.py
          ${DDP_TEST_PYTHON} ${CMAKE_CURRENT_BINARY_DIR}/examples_work/gpt_train)
set_tests_properties(gpt_train_parity PROPERTIES TIMEOUT 240 LABELS "integration")
