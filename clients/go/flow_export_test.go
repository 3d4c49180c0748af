package policyclient

import "context"

// FlushOutcomes sends c's queued outcomes and waits until they are sent.
func FlushOutcomes(ctx context.Context, c *Client) { c.out.flushNow(ctx) }

// FlowControlled reports whether c asks Admit for a lease before attempts
// to target.
func FlowControlled(c *Client, target string) bool { return c.flow.controlled(target) }
