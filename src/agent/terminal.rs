//! The user's terminal: raw mode (restored on drop and on panic) and its size.
#![allow(unsafe_code)]

use std::sync::Mutex;

/// The terminal settings to restore, shared with the panic hook.
static SAVED: Mutex<Option<libc::termios>> = Mutex::new(None);

pub fn is_terminal(fd: i32) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd) == 1 }
}

/// (rows, cols) of the terminal on `fd`, if it is one.
pub fn size(fd: i32) -> Option<(u16, u16)> {
    let mut size = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes a winsize into the struct we own.
    let result = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut size) };
    (result == 0 && size.ws_row > 0 && size.ws_col > 0).then_some((size.ws_row, size.ws_col))
}

/// Puts standard input in raw mode until dropped.
pub struct RawMode;

impl RawMode {
    pub fn enable() -> std::io::Result<RawMode> {
        let mut termios = std::mem::MaybeUninit::<libc::termios>::uninit();
        // SAFETY: tcgetattr fills the termios on success; we read it only then.
        if unsafe { libc::tcgetattr(0, termios.as_mut_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: initialised by the successful tcgetattr above.
        let original = unsafe { termios.assume_init() };
        let mut raw = original;
        // SAFETY: cfmakeraw only edits the struct.
        unsafe { libc::cfmakeraw(&mut raw) };
        // SAFETY: applies settings we own to standard input.
        if unsafe { libc::tcsetattr(0, libc::TCSANOW, &raw) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if let Ok(mut saved) = SAVED.lock() {
            *saved = Some(original);
        }
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if super::readiness::panic_is_contained() {
                return;
            }
            restore();
            previous(info);
        }));
        Ok(RawMode)
    }
}

fn restore() {
    if let Ok(mut saved) = SAVED.lock()
        && let Some(original) = saved.take()
    {
        // SAFETY: restores the settings read at enable time.
        unsafe { libc::tcsetattr(0, libc::TCSANOW, &original) };
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        restore();
    }
}
