#pragma once

/// Moved to <ddp/comm_hooks/comm_hooks.h>, beside the other headers of namespace
/// ddp::comm_hooks. This forwarder stays for one release, then goes.

#include <ddp/comm_hooks/comm_hooks.h>
