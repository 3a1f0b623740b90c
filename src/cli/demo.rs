pub fn run(_keep: bool) -> anyhow::Result<i32> {
    Ok(0)
}
