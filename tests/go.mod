module github.com/talaris-go/talaris/tests

go 1.26.0

require (
	github.com/coder/websocket v1.8.15
	github.com/gobwas/ws v1.5.0
	github.com/gorilla/websocket v1.5.3
	golang.org/x/sys v0.50.0
)

require github.com/talaris-go/talaris v0.0.0

require github.com/talaris-go/talaris/internal/wstest v0.0.0

require github.com/gobwas/httphead v0.1.0 // indirect

replace github.com/talaris-go/talaris => ..

replace github.com/talaris-go/talaris/internal/wstest => ../internal/wstest
