#pragma once

/// Forwarding header: the stores live in <ddp/store/>, so include
/// <ddp/store/file_store.h>. This path keeps working through the 0.x releases
/// (README, "Include paths").
#include <ddp/store/file_store.h>
