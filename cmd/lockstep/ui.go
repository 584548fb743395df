package main

import "context"

func cmdUI(ctx context.Context, a *app, args []string) int { return 2 }
