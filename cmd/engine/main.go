// Command engine runs pgdurable as a service (engine serve) and operates it
// from the shell: migrations, runs, dead jobs. See README.md.
package main

import (
	"context"
	"os"

	"github.com/pgdurable/pgdurable/cmd/engine/commands"
)

func main() {
	os.Exit(commands.Execute(context.Background(), os.Args[1:], commands.Options{}))
}
