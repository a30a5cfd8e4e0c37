#pragma once

/// Forwarding header: the stores live in <ddp/store/>, so include
/// <ddp/store/store.h>. This path keeps working through the 0.x releases
/// (README, "Include paths").
#include <ddp/store/store.h>
