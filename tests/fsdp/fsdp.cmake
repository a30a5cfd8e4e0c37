# tests: fsdp
#
# FullyShardedDataParallel, run as real processes under ddprun (and mpirun):
# parity with one process for a Sequential of six units and a custom module
# of three FsdpUnits (every strategy, SGD and Adam, prefetching, clipping),
# no_sync, mixed precision, full states both ways, and the errors.
ddp_add_nn_program(fsdp_main fsdp/fsdp_main.cpp)
ddp_add_launched_test(fsdp_2_ranks NPROC 2 COMMAND fsdp_main CASES 32 TIMEOUT 180)
ddp_add_launched_test(fsdp_3_ranks NPROC 3 COMMAND fsdp_main CASES 32 TIMEOUT 180)
ddp_add_alone_test(fsdp_alone COMMAND fsdp_main CASES 31 TIMEOUT 120)
if(DDP_HAVE_MPI)
  # 2 ranks: the test's small units stay in private memory (under the 64 KiB
  # default); 3 ranks: every shard and reduction buffer is in memory the
  # ranks map (Note [Shards in mapped memory]), and every unit is gathered
  # in one buffer that all of them map (Note [Gathered in common memory]).
  ddp_add_mpi_test(fsdp_mpi_2_ranks NP 2 COMMAND fsdp_main CASES 32 TIMEOUT 180)
  ddp_add_mpi_test(fsdp_mpi_3_ranks NP 3 COMMAND fsdp_main CASES 32 TIMEOUT 180
    ENV DDP_MPI_SHARED_MEMORY_MIN_BYTES=0)
endif()

# Sharded checkpoints: resume equals an uninterrupted run, another world
# size through a full state, a save killed at each point of its commit.
ddp_add_nn_program(fsdp_checkpoint_main fsdp/fsdp_checkpoint_main.cpp)
add_test(NAME fsdp_sharded_checkpoint
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/sharded_checkpoint_cases.sh $<TARGET_FILE:ddprun>
    $<TARGET_FILE:fsdp_checkpoint_main>)
set_tests_properties(fsdp_sharded_checkpoint PROPERTIES TIMEOUT 240 LABELS integration)

# bfloat16 mixed precision against PyTorch's own FSDP on the CPU (Gloo), 2
# ranks, kFullShard and kShardGradOp (pytorch_fsdp_parity.sh): with
# DDP_TEST_PYTHON's PyTorch 2.x; PyTorch 1.13's FSDP does not import on
# Debian 12's Python 3.11, which the script then checks and says.
ddp_add_nn_program(fsdp_pytorch_parity_main fsdp/fsdp_pytorch_parity_main.cpp)
add_test(NAME fsdp_pytorch_parity
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/pytorch_fsdp_parity.sh $<TARGET_FILE:ddprun>
    $<TARGET_FILE:fsdp_pytorch_parity_main> ${DDP_TEST_PYTHON})
set_tests_properties(fsdp_pytorch_parity PROPERTIES TIMEOUT 180 LABELS integration)

# The defaults of the options that PyTorch's FSDP has too, against
# DDP_TEST_PYTHON's PyTorch (2.11 in the compat configuration; 1.13's FSDP
# does not import, which the script checks and says).
add_executable(fsdp_defaults_main fsdp/defaults_main.cpp)
target_link_libraries(fsdp_defaults_main PRIVATE ddp)
add_test(NAME fsdp_defaults_parity
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/defaults_parity.sh $<TARGET_FILE:fsdp_defaults_main> ${DDP_TEST_PYTHON})
set_tests_properties(fsdp_defaults_parity PROPERTIES TIMEOUT 60 LABELS integration)

# Activation checkpointing (ddp::Checkpointed) inside FSDP units and under
# DDP equals training without it: every strategy, dropout, bf16, a unit
# called twice, two forwards before one backward.
ddp_add_nn_program(activation_checkpoint_main fsdp/activation_checkpoint_main.cpp)
ddp_add_launched_test(activation_checkpoint_2_ranks NPROC 2 COMMAND activation_checkpoint_main CASES 19 TIMEOUT 180)
ddp_add_launched_test(activation_checkpoint_3_ranks NPROC 3 COMMAND activation_checkpoint_main CASES 19 TIMEOUT 180)
if(DDP_HAVE_MPI)
  ddp_add_mpi_test(activation_checkpoint_mpi_2_ranks NP 2 COMMAND activation_checkpoint_main CASES 19 TIMEOUT 180)
  # 3 ranks: every unit gathered in memory the ranks map (Note [Gathered in
  # common memory]): recomputation, a unit called twice, two forwards.
  ddp_add_mpi_test(activation_checkpoint_mpi_3_ranks NP 3 COMMAND activation_checkpoint_main CASES 19 TIMEOUT 180
    ENV DDP_MPI_SHARED_MEMORY_MIN_BYTES=0)
endif()

# Auto-wrap policies: the units chosen in nested custom modules and
# Sequentials, and training with them equals one process.
ddp_add_nn_program(auto_wrap_main fsdp/auto_wrap_main.cpp)
ddp_add_launched_test(fsdp_auto_wrap_2_ranks NPROC 2 COMMAND auto_wrap_main CASES 5 TIMEOUT 120)
ddp_add_launched_test(fsdp_auto_wrap_3_ranks NPROC 3 COMMAND auto_wrap_main CASES 5 TIMEOUT 120)
if(DDP_HAVE_MPI)
  ddp_add_mpi_test(fsdp_auto_wrap_mpi_2_ranks NP 2 COMMAND auto_wrap_main CASES 5 TIMEOUT 120)
endif()

# Deferred construction (ddp::deferred_unit) and seeded initialisation: a
# model built unit by unit equals the one built whole, bit for bit.
ddp_add_nn_program(deferred_init_main fsdp/deferred_init_main.cpp)
ddp_add_launched_test(fsdp_deferred_init_2_ranks NPROC 2 COMMAND deferred_init_main CASES 7 TIMEOUT 120)
ddp_add_launched_test(fsdp_deferred_init_3_ranks NPROC 3 COMMAND deferred_init_main CASES 7 TIMEOUT 120)
ddp_add_alone_test(fsdp_deferred_init_alone COMMAND deferred_init_main CASES 7 TIMEOUT 60)
