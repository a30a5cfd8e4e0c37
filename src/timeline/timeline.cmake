# The timeline: each rank's last steps as a Chrome trace (Note [Timeline]).
# The merge of the ranks' files and the picture are ddprun's
# (src/launch/readers/).
ddp_add_part(ddp_timeline src/timeline/timeline.cpp)
