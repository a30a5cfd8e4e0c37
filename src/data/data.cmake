# DistributedSampler.
#
# Two parts: ddp_data is the sampler; ddp_data_pg reads the default process
# group for the sampler's default num_replicas and rank. They are separate so
# that the sampler and its unit tests build and link without the
# process-group code (the tests link a fake default_placement() instead);
# libddp links both.
ddp_add_part(ddp_data src/data/distributed_sampler.cpp)
ddp_add_part(ddp_data_pg src/data/default_placement.cpp)
