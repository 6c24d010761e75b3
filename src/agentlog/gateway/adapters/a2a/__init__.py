"""A2A (agent-to-agent) protocol: an A2A server over runs (`server`, `routes`) and an A2A client
tool so a remote A2A agent can be a sub-agent (`client`). Uses the official `a2a-sdk` (the `a2a`
extra): its protobuf types, its JSON-RPC dispatcher and its client."""
