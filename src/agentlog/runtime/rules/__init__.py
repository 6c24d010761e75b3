"""Rules over tool calls: the tool-pattern language (`patterns`: `Bash(npm *)`,
`Edit(file_path ~ "src/**")`, `/mcp__(gh|gl)__.*/`) that permission and reminder rules are
written in, and the reminder plugin (`reminders`)."""
