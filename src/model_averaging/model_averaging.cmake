# Model averaging: PeriodicModelAverager and HierarchicalModelAverager.
ddp_add_part(ddp_model_averaging src/model_averaging/model_averaging.cpp)
