package payment

import "io/fs"

func fsSub() (fs.FS, error) { return fs.Sub(migrationFiles, "migrations") }
