# The plan report (include/ddp/plan.h): the CPU tensor memory counter and
# the figures `ddprun --plan` reads back (Note [Plan report]). The comm
# core feeds it; DDP and FSDP mark its steps.
ddp_add_part(ddp_plan
  src/plan/memory_counter.cpp
  src/plan/plan_recorder.cpp)
