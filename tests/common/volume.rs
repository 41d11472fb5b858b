//! A directory laid out and updated the way the kubelet updates a ConfigMap
//! or Secret volume (its "atomic writer"): each version is written into a
//! fresh `..<timestamp>` directory, a `..data_tmp` symlink to it is renamed
//! over `..data`, and the visible files are symlinks `name -> ..data/name`.
//! Only the rename publishes a version, so a reader never sees half of one.

use std::path::{Path, PathBuf};

pub struct Volume {
    pub dir: PathBuf,
    version: u32,
    current: Option<String>,
}

impl Volume {
    pub fn new(dir: &Path) -> Volume {
        std::fs::create_dir_all(dir).expect("volume dir");
        Volume {
            dir: dir.to_path_buf(),
            version: 0,
            current: None,
        }
    }

    /// Publishes `files` as the volume's new content, in the kubelet's order.
    pub fn publish(&mut self, files: &[(&str, &str)]) {
        self.version += 1;
        let ts = format!(
            "..2026_12_01_00_00_{:02}.{}",
            self.version % 60,
            self.version
        );
        let ts_dir = self.dir.join(&ts);
        std::fs::create_dir(&ts_dir).expect("timestamped dir");
        for (name, body) in files {
            std::fs::write(ts_dir.join(name), body).expect("payload file");
        }
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&ts, &tmp).expect("..data_tmp");
        std::fs::rename(&tmp, self.dir.join("..data")).expect("swap ..data");
        for (name, _) in files {
            let visible = self.dir.join(name);
            if std::fs::symlink_metadata(&visible).is_err() {
                std::os::unix::fs::symlink(format!("..data/{name}"), &visible)
                    .expect("visible symlink");
            }
        }
        // Visible links of files this version dropped, then the old version.
        for entry in std::fs::read_dir(&self.dir).expect("read volume").flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("..") && !files.iter().any(|(n, _)| *n == name) {
                std::fs::remove_file(entry.path()).expect("remove dropped link");
            }
        }
        if let Some(old) = self.current.replace(ts) {
            std::fs::remove_dir_all(self.dir.join(old)).expect("remove old version");
        }
    }
}
