package main

// consoleConfig is the web console at GET / (package rpc/console).
type consoleConfig struct {
	// Enabled serves the console. Default true.
	Enabled bool
	// ShowKeys shows the keys denied most as they are; false shows a hash
	// of each instead. Default false.
	ShowKeys bool
}

// describe is the console's line in the start banner.
func (c consoleConfig) describe(url string) string {
	if !c.Enabled {
		return "console: off"
	}
	return "console: " + url + "/ (keys " + map[bool]string{true: "shown", false: "hashed"}[c.ShowKeys] + ")"
}
